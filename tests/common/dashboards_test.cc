// Checks dashboards/: Grafana JSON, Prometheus config and alert rules, and
// that every PromQL expression names only metrics the daemons export.
#include <algorithm>
#include <cctype>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/daemon_metrics.h"
#include "tests/common/promql_refs.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

// In depthbench::testing: the helpers of tests/common/test_util.h.
namespace depthbench::testing {
namespace {

constexpr char kPromtool[] = "/usr/bin/promtool";

std::string DashboardsDir() { return SourceDir() + "/dashboards"; }

// Names Prometheus itself provides for every target.
const std::set<std::string>& BuiltinSeries() {
  static const auto* s = new std::set<std::string>{"up"};
  return *s;
}

struct NamesCase {
  std::string expr;
  std::vector<std::string> names;
};

class MetricNamesInExpressionTest : public ::testing::TestWithParam<NamesCase> {};

TEST_P(MetricNamesInExpressionTest, Extracts) {
  EXPECT_EQ(MetricNamesInExpression(GetParam().expr), GetParam().names)
      << GetParam().expr;
}

INSTANTIATE_TEST_SUITE_P(
    Table, MetricNamesInExpressionTest,
    ::testing::Values(
        NamesCase{"up", {"up"}},
        NamesCase{"a_total{job=\"x\",le=~\"$v\"}", {"a_total"}},
        NamesCase{"sum by (state, sweep) (rate(x_total[$__rate_interval]))",
                  {"x_total"}},
        NamesCase{"histogram_quantile(0.99, sum without(instance) "
                  "(rate(h_bucket[5m])))",
                  {"h_bucket"}},
        NamesCase{"a / on(job) group_left(sweep) b", {"a", "b"}},
        NamesCase{"a - (a offset 15m) <= 0 and bool b", {"a", "b"}},
        NamesCase{"x > 1e-9 or absent(y{k=\"}\"})", {"x", "y"}},
        NamesCase{"count(m) > 2 unless topk(3, n)", {"m", "n"}},
        NamesCase{"max_over_time(g[1h:5m]) * 3600", {"g"}},
        NamesCase{"ns:rec:rate5m", {"ns:rec:rate5m"}},
        NamesCase{"vector(1)", {}},
        NamesCase{"SUM BY (a) (q)", {"q"}},
        NamesCase{"label_replace(z, \"dst\", \"$1\", \"src\", \"(.*)\")",
                  {"z"}}),
    // "e1_a_total_job_x_le_v": the index, then the expression's letters and
    // digits (runs of anything else become one '_'), at most 40 characters.
    [](const ::testing::TestParamInfo<NamesCase>& info) {
      std::string name = "e" + std::to_string(info.index) + "_";
      for (char c : info.param.expr) {
        if (std::isalnum(static_cast<unsigned char>(c))) {
          name.push_back(c);
        } else if (name.back() != '_') {
          name.push_back('_');
        }
      }
      name.resize(std::min<size_t>(name.size(), 40));
      while (name.back() == '_') name.pop_back();
      return name;
    });

TEST(GrafanaVariablesTest, Substitutes) {
  EXPECT_EQ(SubstituteGrafanaVariables(
                "rate(x{s=~\"$sweep\",a=~\"${arch}\"}[$__rate_interval])"),
            "rate(x{s=~\".*\",a=~\".*\"}[1m])");
  EXPECT_EQ(SubstituteGrafanaVariables("y[$__interval]", "5m"), "y[5m]");
}

TEST(ExtractTest, DashboardJsonIncludesRowsAndVariables) {
  const std::string json = R"json({
    "panels": [
      {"id": 1, "title": "T", "targets": [{"expr": "a", "refId": "A"}]},
      {"id": 2, "type": "row", "panels": [
        {"id": 3, "targets": [{"expr": "b", "refId": "B"}, {"refId": "C"}]}]}
    ],
    "templating": {"list": [
      {"name": "s", "type": "query", "query": "label_values(c{x=\"1,2\"}, sweep)"},
      {"name": "t", "type": "query", "query": {"query": "label_values(job)"}},
      {"name": "u", "type": "custom", "query": "a,b"}
    ]}})json";
  auto exprs = ExtractDashboardExpressions(json, "d.json");
  ASSERT_TRUE(exprs.ok()) << exprs.status();
  ASSERT_EQ(exprs->size(), 3u);
  EXPECT_EQ((*exprs)[0].expr, "a");
  EXPECT_EQ((*exprs)[0].source, "d.json: panel 1 \"T\" A");
  EXPECT_EQ((*exprs)[1].expr, "b");
  EXPECT_EQ((*exprs)[2].expr, "c{x=\"1,2\"}");
  EXPECT_EQ((*exprs)[2].label_values, "sweep");
  EXPECT_FALSE(ExtractDashboardExpressions("{not json", "x").ok());
}

TEST(ExtractTest, RuleFile) {
  auto exprs = ExtractRuleExpressions(
      "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up == 0\n"
      "  - record: r:x\n    expr: |\n      sum(x)\n",
      "r.yml");
  ASSERT_TRUE(exprs.ok()) << exprs.status();
  ASSERT_EQ(exprs->size(), 2u);
  EXPECT_EQ((*exprs)[0].source, "r.yml: g/A");
  EXPECT_EQ((*exprs)[1].expr, "sum(x)");
}

TEST(DashboardsTest, EveryJsonFileIsAValidDashboard) {
  std::set<std::string> uids;
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(
           DashboardsDir() + "/grafana/dashboards")) {
    ++files;
    const std::string text = ReadFileOrDie(entry.path().string());
    const nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
    ASSERT_FALSE(doc.is_discarded()) << entry.path() << " is not JSON";
    EXPECT_TRUE(doc.contains("uid") && doc["uid"].is_string()) << entry.path();
    EXPECT_TRUE(uids.insert(doc.value("uid", "")).second) << "duplicate uid";
    EXPECT_TRUE(doc.contains("title"));
    ASSERT_TRUE(doc["panels"].is_array());
    std::set<int> ids;
    for (const auto& panel : doc["panels"]) {
      EXPECT_TRUE(ids.insert(panel["id"].get<int>()).second) << entry.path();
      EXPECT_EQ(panel["datasource"]["uid"], "depthbench-prometheus");
    }
  }
  EXPECT_EQ(files, 3);
  EXPECT_EQ(uids, (std::set<std::string>{"depthbench-sweeps",
                                         "depthbench-training",
                                         "depthbench-fleet"}));
}

TEST(DashboardsTest, EveryExpressionNamesOnlyExportedMetrics) {
  auto exprs = ExtractAllExpressions(DashboardsDir());
  ASSERT_TRUE(exprs.ok()) << exprs.status();
  ASSERT_GE(exprs->size(), 30u);  // 3 dashboards + alert rules
  const std::vector<std::string> exported = AllExportedSeriesNames();
  std::set<std::string> known(exported.begin(), exported.end());
  known.insert(BuiltinSeries().begin(), BuiltinSeries().end());
  std::set<std::string> used;
  for (const PromQlExpression& e : *exprs) {
    const std::vector<std::string> names = MetricNamesInExpression(e.expr);
    EXPECT_FALSE(names.empty()) << e.source << ": no metric in " << e.expr;
    for (const std::string& name : names) {
      EXPECT_EQ(known.count(name), 1u)
          << e.source << ": \"" << name << "\" is not exported (" << e.expr
          << ")";
      used.insert(name);
    }
  }
  // Every scheduler and worker metric appears on some dashboard or alert.
  for (const MetricSpec& spec : kMetricSpecs) {
    const std::string name = spec.name;
    const bool histogram = std::string(spec.type) == "histogram";
    const bool seen =
        used.count(name) > 0 ||
        (histogram && (used.count(name + "_bucket") > 0 ||
                       used.count(name + "_count") > 0));
    EXPECT_TRUE(seen) << name << " is not shown anywhere in dashboards/";
  }
}

TEST(DashboardsTest, PromtoolAcceptsConfigAndRules) {
  if (!Executable(kPromtool)) GTEST_SKIP() << "promtool not installed";
  std::string out;
  EXPECT_EQ(RunCommand(std::string(kPromtool) + " check config " + DashboardsDir() +
                    "/prometheus.yml",
                &out),
            0)
      << out;
  EXPECT_EQ(RunCommand(std::string(kPromtool) + " check rules " + DashboardsDir() +
                    "/alerts.yml",
                &out),
            0)
      << out;
}

TEST(DashboardsTest, EveryDashboardExpressionParses) {
  // promtool parses rule expressions: wrap each dashboard query (variables
  // substituted) as a recording rule and let it check them all.
  if (!Executable(kPromtool)) GTEST_SKIP() << "promtool not installed";
  auto exprs = ExtractAllExpressions(DashboardsDir());
  ASSERT_TRUE(exprs.ok()) << exprs.status();
  std::string rules = "groups:\n- name: dashboards\n  rules:\n";
  for (size_t i = 0; i < exprs->size(); ++i) {
    nlohmann::json expr = SubstituteGrafanaVariables((*exprs)[i].expr);
    rules += "  - record: dashboard:expr" + std::to_string(i) +
             "\n    expr: " + expr.dump() + "\n";  // JSON string is YAML
  }
  TempDir dir;
  WriteFile(dir.path() + "/rules.yml", rules);
  std::string out;
  EXPECT_EQ(RunCommand(std::string(kPromtool) + " check rules " + dir.path() +
                    "/rules.yml",
                &out),
            0)
      << out << rules;
  // And promtool does reject a broken expression (the check can fail).
  WriteFile(dir.path() + "/bad.yml",
            "groups:\n- name: g\n  rules:\n  - record: r\n    expr: "
            "\"sum(rate(x[5m])\"\n");
  EXPECT_NE(RunCommand(std::string(kPromtool) + " check rules " + dir.path() +
                    "/bad.yml",
                &out),
            0);
}

TEST(DashboardsTest, ExtractQueriesScriptAgreesWithCpp) {
  if (!Executable("/usr/bin/python3")) GTEST_SKIP() << "python3 not installed";
  auto exprs = ExtractAllExpressions(DashboardsDir());
  ASSERT_TRUE(exprs.ok()) << exprs.status();
  std::string out;
  ASSERT_EQ(RunCommand("/usr/bin/python3 " + DashboardsDir() + "/extract_queries.py",
                &out),
            0)
      << out;
  std::vector<std::string> lines;
  std::stringstream stream(out);
  for (std::string line; std::getline(stream, line);) {
    lines.push_back(nlohmann::json::parse(line)["expr"].get<std::string>());
  }
  std::vector<std::string> cpp;
  for (const PromQlExpression& e : *exprs) cpp.push_back(e.expr);
  EXPECT_EQ(lines, cpp);
}

}  // namespace
}  // namespace depthbench::testing
