#include "worker/output_limits.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "worker/job_runner.h"

namespace depthbench::worker {
namespace {

namespace v1 = ::depthbench::v1;

bool ValidUtf8(const std::string& s) {
  v1::FinishJobRequest probe;
  probe.set_reason(s);
  std::string wire;
  if (!probe.SerializeToString(&wire)) return false;
  v1::FinishJobRequest back;
  return back.ParseFromString(wire);  // proto3 strings: UTF-8 checked here
}

TEST(SanitizeUtf8Test, ReplacesInvalidBytesAndKeepsValidText) {
  EXPECT_EQ(SanitizeUtf8("plain", 100), "plain");
  EXPECT_EQ(SanitizeUtf8("\xE2\x82\xAC \xC3\xA9", 100), "\xE2\x82\xAC \xC3\xA9");
  EXPECT_EQ(SanitizeUtf8("a\xFF" "b", 100), "a\xEF\xBF\xBD" "b");
  // A multi-byte character cut short, an overlong form, a surrogate.
  EXPECT_EQ(SanitizeUtf8("x\xE2\x82", 100), "x\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(SanitizeUtf8("\xC0\xAF", 100), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(SanitizeUtf8("\xED\xA0\x80", 100), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_FALSE(ValidUtf8("a\xFF"));
  EXPECT_TRUE(ValidUtf8(SanitizeUtf8("a\xFF\xE2\x82", 100)));
}

TEST(SanitizeUtf8Test, CutsAtCharacterBoundariesWithinTheLimit) {
  std::string euros;
  for (int i = 0; i < 10; ++i) euros += "\xE2\x82\xAC";
  for (size_t max = 0; max <= 32; ++max) {
    std::string head = SanitizeUtf8(euros, max);
    EXPECT_LE(head.size(), max);
    EXPECT_TRUE(ValidUtf8(head)) << max;
    std::string tail = SanitizeUtf8Tail(euros + "\xFF", max);
    EXPECT_LE(tail.size(), max);
    EXPECT_TRUE(ValidUtf8(tail)) << max;
  }
  EXPECT_EQ(SanitizeUtf8("abcdefgh", 6), "abc...");
  EXPECT_EQ(SanitizeUtf8Tail("abcdefgh", 6), "...fgh");
  EXPECT_EQ(SanitizeUtf8Tail("abc", 6), "abc");
}

TEST(LineSplitterTest, SplitsAcrossChunksAndCutsLongLinesWithoutBufferingThem) {
  LineSplitter lines(8);
  std::vector<std::pair<std::string, bool>> got;
  auto on = [&](std::string_view l, bool cut) { got.emplace_back(std::string(l), cut); };
  lines.Feed("ab", 2, on);
  lines.Feed("c\nde", 4, on);
  // A 10 MB line arrives in 64 KiB chunks: never more than 8 bytes held.
  std::string chunk(65536, 'x');
  for (int i = 0; i < 160; ++i) {
    lines.Feed(chunk.data(), chunk.size(), on);
    EXPECT_LE(lines.buffered(), 8u);
  }
  lines.Feed("yy\nlast", 7, on);
  lines.Finish(on);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0], std::make_pair(std::string("abc"), false));
  EXPECT_EQ(got[1], std::make_pair(std::string("dexxxxxx"), true));  // head of the long line
  EXPECT_EQ(got[2], std::make_pair(std::string("last"), false));
  EXPECT_EQ(lines.cut_lines(), 1);
}

TEST(RateLimiterTest, BurstThenRate) {
  RateLimiter limiter(3, 1.0);  // 3 at once, then 1 per second
  int allowed = 0;
  for (int i = 0; i < 100; ++i) allowed += limiter.Allow(1000) ? 1 : 0;
  EXPECT_EQ(allowed, 3);
  EXPECT_EQ(limiter.TakeSuppressed(), 97);
  EXPECT_EQ(limiter.TakeSuppressed(), 0);
  EXPECT_TRUE(limiter.Allow(2000));
  EXPECT_FALSE(limiter.Allow(2100));
}

TEST(CappedFileTest, StopsAtTheCapWithANote) {
  std::string path = (std::filesystem::temp_directory_path() /
                      ("capped_file_test_" + std::to_string(getpid())))
                         .string();
  {
    CappedFile f;
    ASSERT_TRUE(f.Open(path, 100));
    EXPECT_TRUE(f.Write(std::string(60, 'a')));
    EXPECT_FALSE(f.Write(std::string(60, 'b')));
    EXPECT_FALSE(f.Write("c"));
    EXPECT_EQ(f.written(), 60);
    EXPECT_EQ(f.dropped(), 61);
  }
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str().substr(0, 60), std::string(60, 'a'));
  EXPECT_NE(ss.str().find("limit of 100 bytes"), std::string::npos);
  EXPECT_LT(ss.str().size(), 200u);
  std::filesystem::remove(path);
}

TEST(FinishReportTest, SanitizedAndMinimalReportsAreValidAndSmall) {
  v1::FinishJobRequest r;
  r.set_job_id(7);
  r.set_attempt_id(9);
  r.set_status(v1::FINISH_FAILED);
  r.set_reason(std::string(100000, 'e') + "\xFF");
  r.set_final_step(12);
  SanitizeFinishReport(&r);
  EXPECT_LE(r.reason().size(), kMaxReasonBytes);
  EXPECT_TRUE(ValidUtf8(r.reason()));

  v1::FinishJobRequest big;
  big.set_job_id(7);
  big.set_attempt_id(9);
  big.set_status(v1::FINISH_SUCCEEDED);
  big.set_has_val_loss(true);
  big.set_final_val_loss(2.5);
  big.set_final_step(40);
  big.add_diagnostics()->set_data_json(std::string(5 << 20, 'x'));
  v1::FinishJobRequest m = MinimalFinishReport(big, "too big");
  EXPECT_EQ(m.status(), v1::FINISH_FAILED);  // the diagnostics would be lost
  EXPECT_NE(m.reason().find("diagnostics could not be reported"), std::string::npos);
  EXPECT_EQ(m.diagnostics_size(), 0);
  EXPECT_EQ(m.final_step(), 40);
  EXPECT_LT(m.ByteSizeLong(), 4096u);

  v1::FinishJobRequest plain = big;
  plain.clear_diagnostics();
  plain.set_reason("x\xFF");
  m = MinimalFinishReport(plain, "RESOURCE_EXHAUSTED");
  EXPECT_EQ(m.status(), v1::FINISH_SUCCEEDED);
  EXPECT_TRUE(m.has_val_loss());
  EXPECT_TRUE(ValidUtf8(m.reason()));
}

}  // namespace
}  // namespace depthbench::worker
