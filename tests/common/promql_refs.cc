#include "tests/common/promql_refs.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace depthbench {
namespace {

bool IsIdentStart(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':';
}
bool IsIdentChar(char c) {
  return IsIdentStart(c) || std::isdigit(static_cast<unsigned char>(c));
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Index just past the quoted string starting at `i` (expr[i] is the quote).
size_t SkipString(const std::string& expr, size_t i) {
  const char quote = expr[i++];
  while (i < expr.size() && expr[i] != quote) {
    if (expr[i] == '\\' && quote != '`') ++i;
    ++i;
  }
  return std::min(i + 1, expr.size());
}

// Index just past the bracket group opened at `i`, honouring strings.
size_t SkipGroup(const std::string& expr, size_t i, char open, char close) {
  int depth = 0;
  while (i < expr.size()) {
    const char c = expr[i];
    if (c == '"' || c == '\'' || c == '`') {
      i = SkipString(expr, i);
      continue;
    }
    if (c == open) ++depth;
    if (c == close && --depth == 0) return i + 1;
    ++i;
  }
  return i;
}

size_t SkipSpace(const std::string& expr, size_t i) {
  while (i < expr.size() && std::isspace(static_cast<unsigned char>(expr[i]))) {
    ++i;
  }
  return i;
}

const std::set<std::string>& LabelListKeywords() {
  static const auto* k = new std::set<std::string>{
      "by", "without", "on", "ignoring", "group_left", "group_right"};
  return *k;
}

const std::set<std::string>& Keywords() {
  static const auto* k = new std::set<std::string>{
      "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan",
      "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count",
      "count_values", "bottomk", "topk", "quantile"};
  return *k;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::string Trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// A template-variable query: label_values(SEL, label), label_values(label),
// query_result(EXPR) or plain PromQL. Returns false if it names no metric.
bool VariableExpression(const std::string& query, PromQlExpression* out) {
  const std::string q = Trim(query);
  auto unwrap = [&q](const std::string& fn, std::string* inner) {
    if (q.rfind(fn + "(", 0) != 0 || q.back() != ')') return false;
    *inner = q.substr(fn.size() + 1, q.size() - fn.size() - 2);
    return true;
  };
  std::string inner;
  if (unwrap("label_values", &inner)) {
    // The label is after the last top-level comma.
    int depth = 0;
    size_t comma = std::string::npos;
    for (size_t i = 0; i < inner.size(); ++i) {
      const char c = inner[i];
      if (c == '"' || c == '\'' || c == '`') {
        i = SkipString(inner, i) - 1;
        continue;
      }
      if (c == '{' || c == '(' || c == '[') ++depth;
      if (c == '}' || c == ')' || c == ']') --depth;
      if (c == ',' && depth == 0) comma = i;
    }
    if (comma == std::string::npos) return false;  // label_values(label)
    out->expr = Trim(inner.substr(0, comma));
    out->label_values = Trim(inner.substr(comma + 1));
    return true;
  }
  if (unwrap("query_result", &inner)) {
    out->expr = Trim(inner);
    return true;
  }
  out->expr = q;
  return true;
}

void CollectPanels(const nlohmann::json& panels, const std::string& source,
                   std::vector<PromQlExpression>* out) {
  if (!panels.is_array()) return;
  for (const nlohmann::json& panel : panels) {
    const std::string title = panel.value("title", "");
    const std::string id =
        panel.contains("id") ? panel["id"].dump() : std::string("?");
    if (panel.contains("targets") && panel["targets"].is_array()) {
      for (const nlohmann::json& t : panel["targets"]) {
        if (!t.contains("expr") || !t["expr"].is_string()) continue;
        out->push_back(PromQlExpression{
            absl::StrCat(source, ": panel ", id, " \"", title, "\" ",
                         t.value("refId", "")),
            t["expr"].get<std::string>(), ""});
      }
    }
    if (panel.contains("panels")) CollectPanels(panel["panels"], source, out);
  }
}

}  // namespace

absl::StatusOr<std::vector<PromQlExpression>> ExtractDashboardExpressions(
    const std::string& json_text, const std::string& source_name) {
  nlohmann::json doc = nlohmann::json::parse(json_text, nullptr,
                                             /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, ": not a JSON object"));
  }
  std::vector<PromQlExpression> out;
  if (doc.contains("panels")) CollectPanels(doc["panels"], source_name, &out);
  if (doc.contains("templating") && doc["templating"].contains("list")) {
    for (const nlohmann::json& var : doc["templating"]["list"]) {
      if (var.value("type", "") != "query" || !var.contains("query")) continue;
      std::string query;
      if (var["query"].is_string()) {
        query = var["query"].get<std::string>();
      } else if (var["query"].is_object() &&
                 var["query"].contains("query")) {
        query = var["query"]["query"].get<std::string>();
      }
      PromQlExpression e;
      e.source = absl::StrCat(source_name, ": variable $",
                              var.value("name", ""));
      if (!query.empty() && VariableExpression(query, &e)) out.push_back(e);
    }
  }
  return out;
}

absl::StatusOr<std::vector<PromQlExpression>> ExtractRuleExpressions(
    const std::string& yaml_text, const std::string& source_name) {
  std::vector<PromQlExpression> out;
  try {
    const YAML::Node doc = YAML::Load(yaml_text);
    for (const YAML::Node& group : doc["groups"]) {
      const std::string group_name = group["name"].as<std::string>("");
      for (const YAML::Node& rule : group["rules"]) {
        const std::string name = rule["alert"]
                                     ? rule["alert"].as<std::string>()
                                     : rule["record"].as<std::string>("");
        out.push_back(PromQlExpression{
            absl::StrCat(source_name, ": ", group_name, "/", name),
            Trim(rule["expr"].as<std::string>()), ""});
      }
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, ": ", std::string(e.what())));
  }
  return out;
}

absl::StatusOr<std::vector<PromQlExpression>> ExtractAllExpressions(
    const std::string& dashboards_dir) {
  namespace fs = std::filesystem;
  std::vector<PromQlExpression> all;
  std::vector<fs::path> jsons;
  std::error_code ec;
  for (const auto& entry :
       fs::directory_iterator(fs::path(dashboards_dir) / "grafana" /
                                  "dashboards",
                              ec)) {
    if (entry.path().extension() == ".json") jsons.push_back(entry.path());
  }
  if (ec) {
    return absl::NotFoundError(
        absl::StrCat(dashboards_dir, "/grafana/dashboards: ", ec.message()));
  }
  std::sort(jsons.begin(), jsons.end());
  for (const fs::path& path : jsons) {
    ASSIGN_OR_RETURN(std::string text, ReadFile(path.string()));
    ASSIGN_OR_RETURN(std::vector<PromQlExpression> exprs,
                     ExtractDashboardExpressions(
                         text, path.filename().string()));
    all.insert(all.end(), exprs.begin(), exprs.end());
  }
  const std::string config_path = dashboards_dir + "/prometheus.yml";
  ASSIGN_OR_RETURN(std::string config_text, ReadFile(config_path));
  std::vector<std::string> rule_files;
  try {
    const YAML::Node config = YAML::Load(config_text);
    for (const YAML::Node& f : config["rule_files"]) {
      rule_files.push_back(f.as<std::string>());
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path, ": ", std::string(e.what())));
  }
  for (const std::string& rel : rule_files) {
    ASSIGN_OR_RETURN(std::string text, ReadFile(dashboards_dir + "/" + rel));
    ASSIGN_OR_RETURN(std::vector<PromQlExpression> exprs,
                     ExtractRuleExpressions(text, rel));
    all.insert(all.end(), exprs.begin(), exprs.end());
  }
  return all;
}

std::string SubstituteGrafanaVariables(const std::string& expr,
                                       const std::string& range) {
  std::string out;
  for (size_t i = 0; i < expr.size();) {
    if (expr[i] != '$') {
      out.push_back(expr[i++]);
      continue;
    }
    size_t j = i + 1;
    std::string name;
    if (j < expr.size() && expr[j] == '{') {
      const size_t close = expr.find('}', j);
      if (close == std::string::npos) {
        out.append(expr.substr(i));
        break;
      }
      name = expr.substr(j + 1, close - j - 1);
      j = close + 1;
    } else {
      while (j < expr.size() && (std::isalnum(static_cast<unsigned char>(
                                      expr[j])) ||
                                  expr[j] == '_')) {
        ++j;
      }
      name = expr.substr(i + 1, j - i - 1);
    }
    if (name == "__rate_interval" || name == "__interval" ||
        name == "__range") {
      out.append(range);
    } else {
      out.append(".*");
    }
    i = j;
  }
  return out;
}

std::vector<std::string> MetricNamesInExpression(const std::string& expr) {
  std::vector<std::string> names;
  size_t i = 0;
  while (i < expr.size()) {
    const char c = expr[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (c == '"' || c == '\'' || c == '`') {
      i = SkipString(expr, i);
    } else if (c == '{') {
      i = SkipGroup(expr, i, '{', '}');  // label matchers
    } else if (c == '[') {
      i = SkipGroup(expr, i, '[', ']');  // range / subquery
    } else if (c == '#') {
      while (i < expr.size() && expr[i] != '\n') ++i;  // comment
    } else if (c == '$') {
      ++i;  // Grafana variable
      if (i < expr.size() && expr[i] == '{') {
        i = SkipGroup(expr, i, '{', '}');
      } else {
        while (i < expr.size() && IsIdentChar(expr[i])) ++i;
      }
    } else if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') {
      // Number or duration: 1, 0.5, 1e-9, 0x1f, 15m, 1h30m.
      ++i;
      while (i < expr.size() &&
             (std::isalnum(static_cast<unsigned char>(expr[i])) ||
              expr[i] == '.' ||
              ((expr[i] == '-' || expr[i] == '+') &&
               (expr[i - 1] == 'e' || expr[i - 1] == 'E')))) {
        ++i;
      }
    } else if (IsIdentStart(c)) {
      const size_t start = i;
      while (i < expr.size() && IsIdentChar(expr[i])) ++i;
      const std::string ident = expr.substr(start, i - start);
      const std::string lower = Lower(ident);
      const size_t next = SkipSpace(expr, i);
      if (LabelListKeywords().count(lower) > 0) {
        if (next < expr.size() && expr[next] == '(') {
          i = SkipGroup(expr, next, '(', ')');
        }
      } else if (Keywords().count(lower) > 0) {
        // operator or aggregation
      } else if (next < expr.size() && expr[next] == '(') {
        // function call
      } else if (std::find(names.begin(), names.end(), ident) ==
                 names.end()) {
        names.push_back(ident);
      }
    } else {
      ++i;
    }
  }
  return names;
}

}  // namespace depthbench
