// cli/spec_reader: a sweep spec written in YAML and in JSON reads to the same
// SweepSpec; malformed input is refused with the path of the offending field;
// and what the reader accepts but the scheduler cannot run is refused by
// ExpandSweep (what SubmitSweep runs) with the same path style.
#include "cli/spec_reader.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include "scheduler/sweep_expander.h"

namespace depthbench::cli {
namespace {

namespace v1 = ::depthbench::v1;
using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Every field of the spec, once in YAML (block and flow style, unquoted
// scalars, LxD shorthands) and once in JSON.
constexpr char kFullYaml[] = R"yaml(
name: depth-vs-width
architectures: [pre_ln, hc, attnres_block]
shapes:
  explicit: ["4x96", {layers: 8, d_model: 64, vocab: 512, heads: 4, kv_heads: 2}]
lr_grids:
  pre_ln: [1.0e-3, 3e-3]
  hc:
    - 0.002
seeds: [0, 7]
training:
  data: brown
  seq_len: 64
  batch: 8
  tokens_per_param: 20
  steps: 120
  tokens: 100000
  eval_interval: 20
  eval_batches: 4
  checkpoint_interval: 40
  checkpoint_minutes: 7.5
  threads: 2
  warmup_frac: 0.1
  min_lr_frac: 0.1
  weight_decay: 0.1
  grad_clip: 1.0
  explode_threshold: 12.5
  hc_streams: 4
  hc_form: paper
  log_interval: 5
retry: {max_attempts: 4, initial_backoff_ms: 250, backoff_multiplier: 1.5, max_backoff_ms: 8000}
diagnostics:
  kinds: [angular, deff]
  num_sequences: 64
  allow_small_n: true
  causal_form: ratio_of_means
  fixed_lr: 2e-3
resources:
  devices: 1
  memory_mb: 2048
  labels: {pool: "a100", zone: "7"}
)yaml";

constexpr char kFullJson[] = R"json({
  "name": "depth-vs-width",
  "architectures": ["pre_ln", "hc", "attnres_block"],
  "shapes": {"explicit": [{"layers": 4, "d_model": 96},
                          {"layers": 8, "d_model": 64, "vocab": 512, "heads": 4, "kv_heads": 2}]},
  "lr_grids": {"pre_ln": [0.001, 0.003], "hc": {"lrs": [0.002]}},
  "seeds": [0, 7],
  "training": {"data": "brown", "seq_len": 64, "batch": 8, "tokens_per_param": 20.0,
               "steps": 120, "tokens": 100000, "eval_interval": 20, "eval_batches": 4,
               "checkpoint_interval": 40, "checkpoint_minutes": 7.5, "threads": 2,
               "warmup_frac": 0.1,
               "min_lr_frac": 0.1, "weight_decay": 0.1, "grad_clip": 1,
               "explode_threshold": 12.5, "hc_streams": 4, "hc_form": "paper",
               "log_interval": 5},
  "retry": {"max_attempts": 4, "initial_backoff_ms": 250, "backoff_multiplier": 1.5,
            "max_backoff_ms": 8000},
  "diagnostics": {"kinds": ["angular", "deff"], "num_sequences": 64, "allow_small_n": true,
                  "causal_form": "ratio_of_means", "fixed_lr": 0.002},
  "resources": {"devices": 1, "memory_mb": 2048, "labels": {"pool": "a100", "zone": "7"}}
})json";

TEST(SpecReaderTest, YamlAndJsonReadToTheSameSpec) {
  absl::StatusOr<v1::SweepSpec> yaml = ParseSpecYaml(kFullYaml);
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  absl::StatusOr<v1::SweepSpec> json = ParseSpecJson(kFullJson);
  ASSERT_TRUE(json.ok()) << json.status();
  std::string diff;
  MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&diff);
  EXPECT_TRUE(differencer.Compare(*yaml, *json)) << diff;

  // And the values are the ones written, not merely equal to each other.
  const v1::SweepSpec& s = *yaml;
  EXPECT_EQ(s.name(), "depth-vs-width");
  ASSERT_EQ(s.architectures_size(), 3);
  EXPECT_EQ(s.architectures(2), "attnres_block");
  ASSERT_EQ(s.shapes().explicit_shapes_size(), 2);
  EXPECT_EQ(s.shapes().explicit_shapes(0).layers(), 4);
  EXPECT_EQ(s.shapes().explicit_shapes(0).d_model(), 96);
  EXPECT_EQ(s.shapes().explicit_shapes(1).kv_heads(), 2);
  ASSERT_EQ(s.lr_grids().at("pre_ln").lrs_size(), 2);
  EXPECT_DOUBLE_EQ(s.lr_grids().at("pre_ln").lrs(0), 1e-3);
  EXPECT_DOUBLE_EQ(s.lr_grids().at("hc").lrs(0), 2e-3);
  EXPECT_EQ(s.seeds(1), 7);
  EXPECT_EQ(s.training().data(), "brown");
  EXPECT_EQ(s.training().steps(), 120);
  EXPECT_DOUBLE_EQ(s.training().tokens_per_param(), 20);
  EXPECT_DOUBLE_EQ(s.training().explode_threshold(), 12.5);
  EXPECT_DOUBLE_EQ(s.training().checkpoint_minutes(), 7.5);
  EXPECT_EQ(s.training().hc_form(), "paper");
  EXPECT_TRUE(s.training().has_log_interval());
  EXPECT_FALSE(s.training().has_tokens() && s.training().tokens() != 100000);
  EXPECT_EQ(s.retry().max_attempts(), 4);
  EXPECT_DOUBLE_EQ(s.retry().backoff_multiplier(), 1.5);
  ASSERT_EQ(s.diagnostics().kinds_size(), 2);
  EXPECT_EQ(s.diagnostics().kinds(1), "deff");
  EXPECT_EQ(s.diagnostics().num_sequences(), 64);
  EXPECT_TRUE(s.diagnostics().allow_small_n());
  EXPECT_EQ(s.diagnostics().causal_form(), "ratio_of_means");
  EXPECT_DOUBLE_EQ(s.diagnostics().fixed_lr(), 2e-3);
  EXPECT_EQ(s.resources().devices(), 1);
  EXPECT_EQ(s.resources().labels().at("zone"), "7");  // quoted: stays a string
}

TEST(SpecReaderTest, ShorthandsAndProtoFieldNamesReadAlike) {
  auto a = ParseSpecYaml(R"(
shapes: {solver: {ref: 24x1024, layers: [16, 32], match: backbone}}
lr_grids: {hc: [0.001]}
diagnostics: [deff]
)");
  auto b = ParseSpecYaml(R"(
shapes: {solver: {ref_layers: 24, ref_d_model: 1024, layers: [16, 32], match: backbone}}
lr_grids: {hc: {lrs: [0.001]}}
diagnostics: {kinds: [deff]}
)");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*a, *b));
  EXPECT_EQ(a->shapes().solver().ref_d_model(), 1024);

  auto c = ParseSpecYaml("shapes: {explicit: [2x64]}");
  auto d = ParseSpecJson(R"({"shapes": {"explicit_shapes": [{"layers": 2, "d_model": 64}]}})");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*c, *d));
}

TEST(SpecReaderTest, StrategyShorthandAndObjectReadAlike) {
  auto a = ParseSpecYaml("strategy: successive_halving+lr_transfer");
  auto b = ParseSpecJson(R"({"strategy": {"kind": "successive_halving+lr_transfer"}})");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*a, *b));
  auto c = ParseSpecYaml(R"(
strategy:
  kind: successive_halving
  rungs: [0.25, 0.5, 1]
  reduction_factor: 2
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->strategy().rungs_size(), 3);
  EXPECT_EQ(c->strategy().reduction_factor(), 2);
  auto bad = ParseSpecYaml("strategy: {kind: lr_transfer, eta: 3}");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("spec.strategy.eta"));
}

TEST(SpecReaderTest, IntegralFloatsAreIntegers) {
  auto spec = ParseSpecJson(R"({"training": {"steps": 100.0}, "seeds": [1e3]})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->training().steps(), 100);
  EXPECT_EQ(spec->seeds(0), 1000);
}

class SpecFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("cli_spec_reader_test_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  std::string dir_;
};

TEST_F(SpecFileTest, ReadsByExtension) {
  auto yaml = ReadSpecFile(Write("s.yaml", kFullYaml));
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  auto json = ReadSpecFile(Write("s.json", kFullJson));
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*yaml, *json));
  // A JSON document is valid YAML, but a .json file must be JSON.
  EXPECT_TRUE(ReadSpecFile(Write("j.yml", kFullJson)).ok());
  absl::StatusOr<v1::SweepSpec> yaml_in_json = ReadSpecFile(Write("y.json", kFullYaml));
  EXPECT_EQ(yaml_in_json.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(yaml_in_json.status().message()), StartsWith("spec: not valid JSON: "));
  absl::StatusOr<v1::SweepSpec> missing = ReadSpecFile(dir_ + "/nope.yaml");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("nope.yaml"));
}

TEST(SpecReaderTest, DemoSpecReadsAndExpands) {
  auto spec = ReadSpecFile(DEPTHBENCH_SOURCE_DIR "/examples/demo_sweep.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto expanded = scheduler::ExpandSweep(*spec);
  ASSERT_TRUE(expanded.ok()) << expanded.status();
  EXPECT_EQ(expanded->jobs.size(), 24u);  // 4 archs x 3 tiny shapes x 2 LRs
  EXPECT_EQ(expanded->retry.max_attempts, 2);
  // Nothing special: D_eff N automatic, the per-token causal form, the
  // best-LR run diagnosed.
  EXPECT_EQ(expanded->diagnose.num_sequences, 0);
  EXPECT_FALSE(expanded->diagnose.allow_small_n);
  EXPECT_EQ(expanded->diagnose.causal_form, "per_token");
  EXPECT_EQ(expanded->diagnose.fixed_lr, 0);
}

// --- errors the reader reports --------------------------------------------

enum class Format { kYaml, kJson };

struct ErrorCase {
  std::string name;
  Format format;
  std::string text;
  std::string message;  // the whole message, or its start when `prefix`
  bool prefix = false;
};

void PrintTo(const ErrorCase& c, std::ostream* os) { *os << c.name; }

class SpecReaderErrorTest : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(SpecReaderErrorTest, NamesTheField) {
  const ErrorCase& c = GetParam();
  absl::StatusOr<v1::SweepSpec> spec =
      c.format == Format::kYaml ? ParseSpecYaml(c.text) : ParseSpecJson(c.text);
  ASSERT_FALSE(spec.ok()) << "accepted: " << spec->DebugString();
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  if (c.prefix) {
    EXPECT_THAT(std::string(spec.status().message()), StartsWith(c.message));
  } else {
    EXPECT_EQ(std::string(spec.status().message()), c.message);
  }
}

constexpr Format kYaml = Format::kYaml;
constexpr Format kJson = Format::kJson;

INSTANTIATE_TEST_SUITE_P(
    Cases, SpecReaderErrorTest,
    ::testing::Values(
        // Unknown keys, at the top and nested, list the valid ones.
        ErrorCase{"UnknownTopLevelKey", kYaml, "name: a\nnmae: b",
                  "spec.nmae: unknown field (valid: architectures, diagnostics, lr_grids, "
                  "name, resources, retry, seeds, shapes, strategy, training)"},
        ErrorCase{"UnknownTrainingKeyJson", kJson, R"({"training": {"stpes": 10}})",
                  "spec.training.stpes: unknown field (valid: ", true},
        ErrorCase{"UnknownShapeKey", kYaml, "shapes: {explicit: [{layers: 4, dmodel: 96}]}",
                  "spec.shapes.explicit[0].dmodel: unknown field (valid: d_model, heads, "
                  "kv_heads, layers, vocab)"},
        // Wrong types.
        ErrorCase{"ArchitecturesNotAList", kYaml, "architectures: pre_ln",
                  "spec.architectures: expected a list, got a string"},
        ErrorCase{"ArchitectureNotAString", kJson, R"({"architectures": ["pre_ln", 3]})",
                  "spec.architectures[1]: expected a string, got a number 3"},
        ErrorCase{"NameNotAString", kYaml, "name: 123",
                  "spec.name: expected a string, got a number 123"},
        ErrorCase{"SeedNotAnInteger", kYaml, "seeds: [0, one]",
                  "spec.seeds[1]: expected an integer, got a string \"one\""},
        ErrorCase{"StepsFractional", kJson, R"({"training": {"steps": 2.5}})",
                  "spec.training.steps: expected an integer, got a number 2.5"},
        ErrorCase{"TrainingNotAMapping", kYaml, "training: 5",
                  "spec.training: expected a mapping, got a number"},
        ErrorCase{"WarmupNotANumber", kYaml, "training: {warmup_frac: ten}",
                  "spec.training.warmup_frac: expected a number, got a string \"ten\""},
        ErrorCase{"LabelNotAString", kYaml, "resources: {labels: {pool: [a]}}",
                  "spec.resources.labels.pool: expected a string, got a list [\"a\"]"},
        ErrorCase{"MaxAttemptsOverflowsInt32", kYaml, "retry: {max_attempts: 4294967299}",
                  "spec.retry.max_attempts: must fit in 32 bits, got 4294967299"},
        ErrorCase{"DevicesOverflowsInt32", kJson, R"({"resources": {"devices": -3000000000}})",
                  "spec.resources.devices: must fit in 32 bits, got -3000000000"},
        ErrorCase{"HugeInteger", kYaml, "seeds: [99999999999999999999]",
                  "spec.seeds[0]: expected an integer, got a number 1e+20"},
        // LR grids.
        ErrorCase{"LrGridNotAList", kYaml, "lr_grids: {hc: 0.001}",
                  "spec.lr_grids[\"hc\"]: expected a list, got a number"},
        ErrorCase{"LrNotANumber", kYaml, "lr_grids: {hc: [0.001, fast]}",
                  "spec.lr_grids[\"hc\"][1]: expected a number, got a string \"fast\""},
        ErrorCase{"LrNotANumberJson", kJson, R"({"lr_grids": {"hc": {"lrs": [0.001, null]}}})",
                  "spec.lr_grids[\"hc\"].lrs[1]: expected a number, got null null"},
        ErrorCase{"LrGridWithoutLrs", kYaml, "lr_grids: {hc: {}}",
                  "spec.lr_grids[\"hc\"].lrs: required"},
        ErrorCase{"LrGridsNotAMapping", kJson, R"({"lr_grids": [0.001]})",
                  "spec.lr_grids: expected a mapping, got a list"},
        // Shapes.
        ErrorCase{"ExplicitShapeNotLxD", kYaml, "shapes: {explicit: [4x96, 4by96]}",
                  "spec.shapes.explicit[1]: expected LxD such as 4x96 or {layers, d_model}, "
                  "got \"4by96\""},
        ErrorCase{"SolverRefNotLxD", kYaml, "shapes: {solver: {ref: 24-1024, layers: [8]}}",
                  "spec.shapes.solver.ref: expected LxD such as 24x1024, got \"24-1024\""},
        ErrorCase{"SolverLayersNotAList", kJson,
                  R"({"shapes": {"solver": {"ref": "24x1024", "layers": 8}}})",
                  "spec.shapes.solver.layers: expected a list, got a number"},
        ErrorCase{"BothExplicitSpellings", kYaml,
                  "shapes: {explicit: [4x96], explicit_shapes: [8x64]}",
                  "spec.shapes.explicit_shapes: give either explicit or explicit_shapes, not both"},
        ErrorCase{"DiagnosticsNotAList", kYaml, "diagnostics: {kinds: deff}",
                  "spec.diagnostics.kinds: expected a list, got a string"},
        ErrorCase{"AllowSmallNNotABool", kYaml, "diagnostics: {kinds: [deff], allow_small_n: yes}",
                  "spec.diagnostics.allow_small_n: expected true or false, got a string \"yes\""},
        ErrorCase{"NumSequencesNotAnInt", kJson,
                  R"({"diagnostics": {"kinds": ["deff"], "num_sequences": 1.5}})",
                  "spec.diagnostics.num_sequences: expected an integer, got a number 1.5"},
        ErrorCase{"UnknownDiagnosticsField", kYaml, "diagnostics: {kinds: [deff], n: 4}",
                  "spec.diagnostics.n: unknown field (valid: allow_small_n, causal_form, fixed_lr, kinds, "
                  "num_sequences)"},
        // Keys given twice: the reader refuses rather than keep one.
        ErrorCase{"DuplicateKeyYaml", kYaml, "name: a\narchitectures: [hc]\nname: b",
                  "spec.name: duplicate key"},
        ErrorCase{"DuplicateKeyJson", kJson, R"({"training": {"steps": 1, "steps": 2}})",
                  "spec.training.steps: duplicate key"},
        ErrorCase{"DuplicateKeyInListJson", kJson,
                  R"({"shapes": {"explicit": [{"layers": 1}, {"layers": 2, "layers": 3}]}})",
                  "spec.shapes.explicit[1].layers: duplicate key"},
        ErrorCase{"DuplicateKeyInListYaml", kYaml,
                  "shapes: {explicit: [{layers: 1}, {layers: 2, layers: 3}]}",
                  "spec.shapes.explicit[1].layers: duplicate key"},
        // Documents that are not a spec at all.
        ErrorCase{"NonScalarKey", kYaml, "? [a, b]\n: 1",
                  "spec: keys must be plain strings, not lists, mappings or null"},
        ErrorCase{"EmptyYaml", kYaml, "", "spec: expected a mapping, got null"},
        ErrorCase{"TopLevelList", kJson, "[1, 2]", "spec: expected a mapping, got a list"},
        ErrorCase{"BadYamlSyntax", kYaml, "name: [unclosed", "spec: not valid YAML: ", true},
        ErrorCase{"BadJsonSyntax", kJson, R"({"name": })", "spec: not valid JSON: ", true}),
    [](const ::testing::TestParamInfo<ErrorCase>& info) { return info.param.name; });

// --- what the reader accepts but the scheduler refuses --------------------
// SubmitSweep runs ExpandSweep before creating anything; its messages use
// the proto's field names, which the reader accepts too.

struct SemanticCase {
  std::string name;
  std::string yaml;
  std::string message;  // start of the message
};

void PrintTo(const SemanticCase& c, std::ostream* os) { *os << c.name; }

class SpecSemanticErrorTest : public ::testing::TestWithParam<SemanticCase> {};

TEST_P(SpecSemanticErrorTest, ExpandSweepNamesTheField) {
  const SemanticCase& c = GetParam();
  // A valid spec, with the case's top-level keys in place of its own.
  std::string text = c.yaml + "\n";
  for (std::string line : {"name: s", "architectures: [pre_ln, hc, attnres_full]",
                           "shapes: {explicit: [4x96]}"}) {
    std::string key = line.substr(0, line.find(':') + 1);
    if (c.yaml.compare(0, key.size(), key) != 0) text += line + "\n";
  }
  absl::StatusOr<v1::SweepSpec> spec = ParseSpecYaml(text);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<scheduler::ExpandedSweep> expanded = scheduler::ExpandSweep(*spec);
  ASSERT_FALSE(expanded.ok()) << "expanded to " << expanded->jobs.size() << " jobs";
  EXPECT_EQ(expanded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(expanded.status().message()), StartsWith(c.message));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SpecSemanticErrorTest,
    ::testing::Values(
        SemanticCase{"UnknownArchitecture", "architectures: [pre_ln, hc, hcc]",
                     "spec.architectures[2]: unknown architecture \"hcc\" (valid: pre_ln, "},
        SemanticCase{"NegativeLr", "lr_grids: {hc: [0.001, -0.002]}",
                     "spec.lr_grids[\"hc\"].lrs[1]: must be a positive finite number, got -0.002"},
        SemanticCase{"EmptyLrGrid", "lr_grids: {hc: []}",
                     "spec.lr_grids[\"hc\"].lrs: at least one learning rate is required"},
        SemanticCase{"LrGridForAnArchNotSwept", "lr_grids: {moda: [0.001]}",
                     "spec.lr_grids[\"moda\"]: architecture is not in spec.architectures"},
        SemanticCase{"HeadsDoNotDivideWidth", "shapes: {explicit: [4x100]}",
                     "spec.shapes.explicit_shapes[0].heads: 16 must divide d_model 100"},
        SemanticCase{"TwoShapeSources", "shapes: {explicit: [4x96], suite: tiny}",
                     "spec.shapes: exactly one of suite, solver or explicit_shapes is required"},
        SemanticCase{"UnknownSuite", "shapes: {suite: enormous}", "spec.shapes.suite: "},
        SemanticCase{"SolverWithoutDepths", "shapes: {solver: {ref: 24x1024}}",
                     "spec.shapes.solver.layers: at least one depth is required"},
        SemanticCase{"BadHcForm", "training: {hc_form: papr}",
                     "spec.training.hc_form: must be \"paper\" or \"code\", got \"papr\""},
        SemanticCase{"ZeroSteps", "training: {steps: 0}",
                     "spec.training.steps: must be positive, got 0"},
        SemanticCase{"DuplicateSeed", "seeds: [1, 2, 1]", "spec.seeds[2]: duplicate seed 1"},
        SemanticCase{"SmallN", "diagnostics: {kinds: [deff], num_sequences: 16}",
                     "spec.diagnostics.num_sequences: 16 sequences is below d_model 96 of shape 4x96"},
        SemanticCase{"BadCausalForm", "diagnostics: {kinds: [causal], causal_form: mean}",
                     "spec.diagnostics.causal_form: must be \"per_token\" or \"ratio_of_means\""},
        SemanticCase{"UnknownStrategy", "strategy: hyperband",
                     "spec.strategy.kind: unknown strategy \"hyperband\""},
        SemanticCase{"BadReductionFactor",
                     "strategy: {kind: successive_halving, reduction_factor: 1}",
                     "spec.strategy.reduction_factor: must be in [2, 1000]"},
        SemanticCase{"RungsNotIncreasing",
                     "strategy: {kind: successive_halving, rungs: [0.5, 0.25]}",
                     "spec.strategy.rungs[1]: must be greater than the rung before it"},
        SemanticCase{"RungsOnOneEvalStep",
                     "strategy: {kind: successive_halving, rungs: [0.1, 0.12]}\n"
                     "training: {steps: 100, eval_interval: 10}",
                     "spec.strategy.rungs[1]: rung 0.12 of a 100-step run falls on step 10"},
        SemanticCase{"ReferenceShapeNotSwept",
                     "strategy: {kind: lr_transfer, reference_shape: 2x64}",
                     "spec.strategy.reference_shape: no shape \"2x64\" in the sweep (shapes: 4x96)"},
        SemanticCase{"FixedLrNotInGrid",
                     "diagnostics: {kinds: [causal], fixed_lr: 3e-3}",
                     "spec.diagnostics.fixed_lr: 0.003 is not in the LR grid of pre_ln"}),
    [](const ::testing::TestParamInfo<SemanticCase>& info) { return info.param.name; });

}  // namespace
}  // namespace depthbench::cli
