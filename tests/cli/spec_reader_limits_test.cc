// Issue 20 items 7-9 on the depthbench client: hostile or broken spec files
// (alias bombs, huge files, numbers out of range, invalid UTF-8) are refused
// with a message naming the field, never by aborting or exhausting memory;
// and every CLI error prints a message.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cli/commands.h"
#include "cli/spec_reader.h"

namespace depthbench::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kBase[] = R"(name: s
architectures: [pre_ln]
shapes: {explicit: ["2x64"]}
)";

// Item 7: a "billion laughs" document. Nine levels of nine would be 387M
// nodes; four levels are enough to show aliases are refused without
// risking the test's memory before the fix.
TEST(SpecReaderLimitsTest, YamlAliasesAreRefused) {
  std::string bomb = std::string(kBase) +
                     "a: &a [x, x, x, x, x, x, x, x, x]\n"
                     "b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                     "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
                     "training: {data: *c}\n";
  auto spec = ParseSpecYaml(bomb);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()),
              StartsWith("spec: YAML aliases (*name) are not supported (line 5"));
  // An anchor without an alias is harmless and stays allowed.
  auto anchored = ParseSpecYaml(std::string(kBase) + "seeds: &s [1, 2]\n");
  EXPECT_TRUE(anchored.ok()) << anchored.status();
}

// Item 7: input is capped before it is parsed.
TEST(SpecReaderLimitsTest, OversizedInputIsRefusedBeforeParsing) {
  std::string big = std::string(kBase) + "seeds: [";
  while (big.size() <= kMaxSpecFileBytes) big += "1, ";
  big += "1]\n";
  auto yaml = ParseSpecYaml(big);
  EXPECT_THAT(std::string(yaml.status().message()), HasSubstr("may be at most 1048576 bytes"));
  auto json = ParseSpecJson(big);
  EXPECT_THAT(std::string(json.status().message()), HasSubstr("may be at most 1048576 bytes"));
  std::string path = std::filesystem::temp_directory_path() /
                     ("spec_limits_" + std::to_string(getpid()) + ".yaml");
  {
    std::ofstream out(path);
    out << big;
  }
  auto file = ReadSpecFile(path);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("larger than 1048576 bytes"));
  std::filesystem::remove(path);
}

// Items 8 and 9: numbers out of range are errors naming the field, not an
// abort (1e400 in JSON threw out of the parser) or a wrap (2^63 became
// -2^63).
TEST(SpecReaderLimitsTest, NumbersOutOfRangeNameTheField) {
  auto inf_json = ParseSpecJson(
      R"({"name": "s", "training": {"seq_len": 8, "tokens_per_param": 1e400}})");
  ASSERT_FALSE(inf_json.ok());
  EXPECT_THAT(std::string(inf_json.status().message()),
              StartsWith("spec.training.tokens_per_param: the number 1e400 is out of range"));
  auto inf_list = ParseSpecJson(R"({"lr_grids": {"pre_ln": [1e-3, -1e999]}})");
  EXPECT_THAT(std::string(inf_list.status().message()),
              StartsWith("spec.lr_grids.pre_ln[1]: the number"));
  auto wrap = ParseSpecJson(R"({"training": {"seq_len": 9223372036854775808}})");
  ASSERT_FALSE(wrap.ok());
  EXPECT_EQ(wrap.status().message(),
            "spec.training.seq_len: 9223372036854775808 is out of the 64-bit integer range");
  auto max = ParseSpecJson(R"({"training": {"seq_len": 9223372036854775807}})");
  EXPECT_TRUE(max.ok()) << max.status();  // in range here; the scheduler bounds it
  auto inf_yaml = ParseSpecYaml(std::string(kBase) + "training: {tokens_per_param: 1e400}\n");
  ASSERT_FALSE(inf_yaml.ok());
  EXPECT_THAT(std::string(inf_yaml.status().message()),
              StartsWith("spec.training.tokens_per_param: must be a finite number"));
  auto dot_inf = ParseSpecYaml(std::string(kBase) + "training: {grad_clip: .inf}\n");
  EXPECT_FALSE(dot_inf.ok());
}

// Item 8: invalid UTF-8 in a YAML scalar or key is refused (proto3 strings
// must be UTF-8), not an abort.
TEST(SpecReaderLimitsTest, InvalidUtf8IsRefusedNamingTheField) {
  auto value = ParseSpecYaml(std::string(kBase) + "training: {data: \"br\xff\xfewn\"}\n");
  ASSERT_FALSE(value.ok());
  EXPECT_EQ(value.status().message(), "spec.training.data: not valid UTF-8");
  auto plain = ParseSpecYaml(std::string(kBase) + "training: {data: br\xc3\x28wn}\n");
  EXPECT_EQ(plain.status().message(), "spec.training.data: not valid UTF-8");
  auto key = ParseSpecYaml(std::string(kBase) + "training: {\xed\xa0\x80: 1}\n");
  EXPECT_EQ(key.status().message(), "spec.training: a key is not valid UTF-8");
  auto utf8 = ParseSpecYaml(std::string(kBase) + "training: {data: \"br\xc3\xb6wn\"}\n");
  EXPECT_TRUE(utf8.ok()) << utf8.status();
  auto json = ParseSpecJson("{\"name\": \"s\xff\"}");
  EXPECT_THAT(std::string(json.status().message()), StartsWith("spec: not valid JSON"));
}

// Item 8: an error with an empty message still says something.
TEST(SpecReaderLimitsTest, EveryCliErrorPrintsAMessage) {
  CommandEnv env;
  std::ostringstream err;
  env.err = &err;
  EXPECT_EQ(env.Fail(absl::InternalError("")), kExitFailure);
  EXPECT_THAT(err.str(), StartsWith("error: the scheduler or the connection failed with "
                                    "INTERNAL and gave no detail"));
  err.str("");
  env.Fail(absl::NotFoundError("sweep \"x\" not found"));
  EXPECT_EQ(err.str(), "error: sweep \"x\" not found [NOT_FOUND]\n");
}

}  // namespace
}  // namespace depthbench::cli
