// Lists every PromQL expression in depthbench's dashboards/ (Grafana panel
// targets, template-variable queries, alert-rule expressions) and the metric
// names each one references. Test-only code: used by
// tests/common/dashboards_test.cc (every name must be exported by the
// daemons) and tests/integration/prometheus_e2e_test.cc (evaluates each
// expression against a real Prometheus). dashboards/extract_queries.py is the
// same listing for the command line.
//
// Library db_promql_refs (tests/common/CMakeLists.txt).
// Thread safety: stateless free functions.
#ifndef DEPTHBENCH_TESTS_COMMON_PROMQL_REFS_H_
#define DEPTHBENCH_TESTS_COMMON_PROMQL_REFS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace depthbench {

struct PromQlExpression {
  std::string source;  // "fleet.json: panel 3 \"Slot utilisation\" A", ...
  std::string expr;    // as written (Grafana variables not substituted)
  // A Grafana template-variable query `label_values(SELECTOR, label)`: expr
  // holds SELECTOR only (a valid PromQL expression), label_values the label.
  std::string label_values;
};

// Expressions of one Grafana dashboard JSON document (panels, nested row
// panels, templating variables). InvalidArgument if the JSON is malformed.
absl::StatusOr<std::vector<PromQlExpression>> ExtractDashboardExpressions(
    const std::string& json_text, const std::string& source_name);

// `expr` of every rule (alerting and recording) of a Prometheus rules file.
absl::StatusOr<std::vector<PromQlExpression>> ExtractRuleExpressions(
    const std::string& yaml_text, const std::string& source_name);

// Everything under `dashboards_dir`: grafana/dashboards/*.json and every
// rules file named by prometheus.yml's rule_files.
absl::StatusOr<std::vector<PromQlExpression>> ExtractAllExpressions(
    const std::string& dashboards_dir);

// Replaces Grafana variables so Prometheus can evaluate the expression:
// $__rate_interval, $__interval, $__range -> `range`; every other $name or
// ${name} -> ".*" (they only appear in regex matchers here).
std::string SubstituteGrafanaVariables(const std::string& expr,
                                       const std::string& range = "1m");

// Metric names referenced by a PromQL expression, in order of appearance,
// without duplicates: bare vector-selector names. Function and aggregation
// names, keywords, label names (in {...} and in by/without/on/ignoring/
// group_left/group_right lists), strings, numbers, durations and Grafana
// variables are skipped.
std::vector<std::string> MetricNamesInExpression(const std::string& expr);

}  // namespace depthbench

#endif  // DEPTHBENCH_TESTS_COMMON_PROMQL_REFS_H_
