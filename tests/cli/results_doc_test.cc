// The CLI's bridge from QueryResults to the report: diagnostics summaries
// (R_causal, R_perm, D_eff/L) and a results.v1 document the report library
// accepts, from a hand-made response.
#include "cli/results_doc.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "cli/report/report.h"

namespace depthbench::cli {
namespace {

namespace v1 = ::depthbench::v1;

constexpr char kDiag[] = R"({
  "causal": {"matrix": [[null, 0.5], [null, null]], "r_causal": 0.25},
  "permutation": {"matrix": [[null, 0.1], [null, null]], "r_perm": 0.5},
  "deff": {"deff": 1.2, "deff_over_l": 0.6},
  "angular": {"matrix": [[null, 0.2, 0.3], [null, 0.1, null], [null, null, null]]}
})";

TEST(ResultsDocTest, SummarizesStoredDiagnostics) {
  DiagnosticsSummary s = SummarizeDiagnostics(kDiag);
  ASSERT_TRUE(s.r_causal && s.r_perm && s.deff_over_l);
  EXPECT_DOUBLE_EQ(*s.r_causal, 0.25);
  EXPECT_DOUBLE_EQ(*s.r_perm, 0.5);
  EXPECT_DOUBLE_EQ(*s.deff_over_l, 0.6);
  DiagnosticsSummary none = SummarizeDiagnostics("{}");
  EXPECT_FALSE(none.r_causal || none.r_perm || none.deff_over_l);
  EXPECT_FALSE(SummarizeDiagnostics("not json").r_causal);
  EXPECT_FALSE(SummarizeDiagnostics(R"({"causal": {"r_causal": null}})").r_causal);
}

// A pre_ln row of shape 2 x 64 (aspect ratio 32), nothing else set.
v1::ResultRow* AddPreLnRow(v1::QueryResultsResponse& resp) {
  v1::ResultRow* row = resp.add_rows();
  row->set_arch("pre_ln");
  row->set_layers(2);
  row->set_d_model(64);
  row->set_aspect_ratio(32);
  return row;
}

TEST(ResultsDocTest, BuildsAValidResultsDocument) {
  v1::QueryResultsResponse resp;
  v1::ResultRow* row = AddPreLnRow(resp);
  row->set_params(1000);
  row->set_has_best(true);
  row->set_best_lr(0.002);
  row->set_best_val_loss(2.5);
  row->set_best_job_id(17);
  row->set_complete(true);
  row->set_diagnostics_json(kDiag);
  v1::LrLoss* a = row->add_lrs();
  a->set_lr(0.002);
  a->set_has_loss(true);
  a->set_val_loss(2.5);
  v1::LrLoss* b = row->add_lrs();
  b->set_lr(0.008);
  b->set_diverged(true);
  v1::ResultRow* pending = resp.add_rows();  // a group still running
  pending->set_arch("hc");
  pending->set_layers(4);
  pending->set_d_model(32);
  pending->set_diagnostics_json("{}");

  nlohmann::json doc = ResultsDocument("s1", resp, {{"job-17", {{1, 5.0}, {2, 4.0}}}});
  ASSERT_TRUE(report::ValidateResults(doc).ok()) << report::ValidateResults(doc) << doc.dump(1);
  const auto& r = doc["rows"][0];
  EXPECT_EQ(r["run_id"], "job-17");
  EXPECT_EQ(r["lr_losses"]["0.002"], 2.5);
  EXPECT_TRUE(r["lr_losses"]["0.008"].is_null());
  EXPECT_EQ(r["diagnostics"]["r_perm"], 0.5);
  EXPECT_EQ(r["diagnostics"]["perm"].size(), 2u);
  EXPECT_EQ(r["diagnostics"]["angular"].size(), 3u);
  EXPECT_FALSE(doc["rows"][1].contains("diagnostics"));
  EXPECT_TRUE(doc["rows"][1]["best_lr"].is_null());
  EXPECT_EQ(doc["curves"]["job-17"].size(), 2u);
  auto md = report::ResultsMarkdown(doc);
  ASSERT_TRUE(md.ok());
  EXPECT_NE(md->find("25.0%"), std::string::npos);  // R_causal in the table
  EXPECT_NE(md->find("50.0%"), std::string::npos);  // R_perm
}

// Diagnostics carrying the new records: the causal form, the D_eff N.
constexpr char kDiagNew[] = R"({
  "causal": {"r_causal": 0.2, "form": "per_token"},
  "permutation": {"r_perm": 0.4},
  "deff": {"deff_over_l": 0.5, "num_sequences": 4096, "sequences": 4096}
})";

TEST(ResultsDocTest, CausalFormAndDeffNAndLegacyMarking) {
  DiagnosticsSummary now = SummarizeDiagnostics(kDiagNew);
  EXPECT_EQ(now.causal_form, "per_token");
  ASSERT_TRUE(now.deff_n.has_value());
  EXPECT_EQ(*now.deff_n, 4096);
  EXPECT_FALSE(now.legacy());
  EXPECT_EQ(CausalFormCell(now), "per_token");
  EXPECT_EQ(DeffNCell(now), "4096");
  // Stored before this version: no "form", no "num_sequences".
  DiagnosticsSummary old = SummarizeDiagnostics(
      R"({"causal": {"r_causal": 0.3}, "deff": {"deff_over_l": 0.9, "sequences": 16}})");
  EXPECT_TRUE(old.legacy());
  EXPECT_EQ(old.causal_form, "legacy");
  EXPECT_TRUE(old.deff_legacy);
  EXPECT_EQ(DeffNCell(old), "16 (legacy)");
  EXPECT_EQ(DeffNCell(SummarizeDiagnostics(R"({"deff": {"deff_over_l": 0.9}})")), "legacy");
  ASSERT_TRUE(old.r_causal.has_value());  // still readable
  EXPECT_DOUBLE_EQ(*old.r_causal, 0.3);
  // Only one kind legacy is enough to mark the row.
  EXPECT_TRUE(SummarizeDiagnostics(R"({"causal": {"r_causal": 0.3}})").legacy());
  // No diagnostics: nothing to mark.
  DiagnosticsSummary none = SummarizeDiagnostics("{}");
  EXPECT_FALSE(none.legacy());
  EXPECT_EQ(CausalFormCell(none), "-");
  EXPECT_EQ(DeffNCell(none), "-");
}

v1::QueryResultsResponse TwoRows() {
  v1::QueryResultsResponse resp;
  for (int i = 0; i < 2; ++i) {
    v1::ResultRow* row = resp.add_rows();
    row->set_arch(i == 0 ? "pre_ln" : "mhc");
    row->set_layers(4);
    row->set_d_model(96);
    row->set_aspect_ratio(24);
    row->set_params(i == 0 ? 455520 : 470000);
    row->set_budget_params(455520);
    row->set_budget_tokens(9110400);
    row->set_budget_steps(17794);
    row->set_has_best(true);
    row->set_best_lr(0.003);
    row->set_best_val_loss(2.5);
    row->set_best_job_id(3 + i);
    row->set_diagnosed_job_id(3 + i);
    row->set_diagnosed_lr(0.002);
    row->set_complete(true);
    row->set_diagnostics_json(i == 0 ? kDiagNew
                                     : R"({"causal": {"r_causal": 0.3}, "deff": {"deff_over_l": 0.9,
                                          "sequences": 16}})");
    v1::LrLoss* l = row->add_lrs();
    l->set_lr(0.003);
    l->set_has_loss(true);
    l->set_val_loss(2.5);
  }
  return resp;
}

TEST(ResultsDocTest, StrategiesShowPrunedNeverRunAndCompute) {
  v1::QueryResultsResponse resp;
  v1::ResultRow* row = AddPreLnRow(resp);
  row->set_tokens_trained(300);
  row->set_grid_tokens(800);
  v1::LrLoss* ran = row->add_lrs();
  ran->set_lr(0.001);
  ran->set_has_loss(true);
  ran->set_val_loss(2.5);
  ran->set_succeeded(1);
  v1::LrLoss* pruned = row->add_lrs();
  pruned->set_lr(0.002);
  pruned->set_pruned_runs(1);
  pruned->set_pruned_rung(1);
  v1::LrLoss* never = row->add_lrs();
  never->set_lr(0.004);
  never->set_never_run(1);
  v1::LrLoss* waiting = row->add_lrs();
  waiting->set_lr(0.008);
  EXPECT_EQ(LrCell(*ran), "2.5");
  EXPECT_EQ(LrCell(*pruned), "pruned@r1");
  EXPECT_EQ(LrCell(*never), "never");
  EXPECT_EQ(LrCell(*waiting), "-");
  EXPECT_EQ(ComputeCell(*row), "37.5%");
  std::ostringstream csv;
  ResultsTable(resp).PrintCsv(csv);
  EXPECT_NE(csv.str().find("2.5,pruned@r1,never,-,"), std::string::npos) << csv.str();
  EXPECT_NE(csv.str().find(",37.5%,no"), std::string::npos) << csv.str();
  nlohmann::json doc = ResultsDocument("s", resp, {});
  EXPECT_EQ(doc["rows"][0]["lr_status"]["0.002"], "pruned@r1");
  EXPECT_EQ(doc["rows"][0]["lr_status"]["0.004"], "never");
  EXPECT_EQ(doc["rows"][0]["lr_status"]["0.001"], "ran");
  EXPECT_EQ(doc["rows"][0]["tokens_trained"], 300);
  EXPECT_EQ(doc["rows"][0]["grid_tokens"], 800);
  ASSERT_TRUE(report::ValidateResults(doc).ok()) << report::ValidateResults(doc);
  auto md = report::ResultsMarkdown(doc);
  ASSERT_TRUE(md.ok()) << md.status();
  EXPECT_NE(md->find("pruned@r1"), std::string::npos) << *md;
  EXPECT_NE(md->find("37.5%"), std::string::npos) << *md;
  nlohmann::json j = ResultsJson(resp);
  EXPECT_EQ(j["rows"][0]["lrs"][1]["pruned_runs"], 1);
  EXPECT_EQ(j["rows"][0]["grid_tokens"], "800");
}

TEST(ResultsDocTest, ResultsTableShowsBudgetFormNAndLegacy) {
  const v1::QueryResultsResponse resp = TwoRows();
  std::ostringstream csv;
  ResultsTable(resp).PrintCsv(csv);
  std::istringstream lines(csv.str());
  std::string header, pre_ln, mhc;
  std::getline(lines, header);
  std::getline(lines, pre_ln);
  std::getline(lines, mhc);
  EXPECT_EQ(header,
            "ARCH,L,D,ASPECT,PARAMS,BEST_LR,VAL_LOSS,TOKENS,STEPS,LR=0.003,DIAG_LR,R_CAUSAL,"
            "CAUSAL_FORM,R_PERM,DEFF/L,DEFF_N,COMPUTE,DONE");
  EXPECT_EQ(pre_ln, "pre_ln,4,96,24,455520,0.003,2.5,9110400,17794,2.5,0.002,0.2,per_token,0.4,"
                    "0.5,4096,-,yes");
  // The same budget for mhc although it has more parameters; legacy marked.
  EXPECT_EQ(mhc, "mhc,4,96,24,470000,0.003,2.5,9110400,17794,2.5,0.002,0.3,legacy,-,0.9,"
                 "16 (legacy),-,yes");
  EXPECT_TRUE(AnyLegacy(resp));
  v1::QueryResultsResponse fresh = resp;
  fresh.mutable_rows()->RemoveLast();
  EXPECT_FALSE(AnyLegacy(fresh));

  nlohmann::json j = ResultsJson(resp);
  ASSERT_EQ(j["rows"].size(), 2u);
  EXPECT_EQ(j["rows"][0]["summary"]["causal_form"], "per_token");
  EXPECT_EQ(j["rows"][0]["summary"]["deff_n"], 4096);
  EXPECT_EQ(j["rows"][0]["summary"]["legacy"], false);
  EXPECT_EQ(j["rows"][1]["summary"]["causal_form"], "legacy");
  EXPECT_EQ(j["rows"][1]["summary"]["legacy"], true);
  EXPECT_EQ(j["rows"][1]["budget_tokens"], "9110400");  // proto JSON: int64 as a string

  nlohmann::json doc = ResultsDocument("s", resp, {});
  ASSERT_TRUE(report::ValidateResults(doc).ok()) << report::ValidateResults(doc);
  EXPECT_EQ(doc["rows"][0]["budget_tokens"], 9110400);
  EXPECT_EQ(doc["rows"][0]["diagnostics"]["causal_form"], "per_token");
  EXPECT_EQ(doc["rows"][0]["diagnostics"]["deff_n"], 4096);
  EXPECT_EQ(doc["rows"][1]["diagnostics"]["legacy"], true);
  auto md = report::ResultsMarkdown(doc);
  ASSERT_TRUE(md.ok()) << md.status();
  EXPECT_NE(md->find("20.0% (per_token)"), std::string::npos) << *md;
  EXPECT_NE(md->find("30.0% (legacy)"), std::string::npos) << *md;
  EXPECT_NE(md->find("| 9.1 |"), std::string::npos) << *md;  // tokens (M)
  EXPECT_NE(md->find("legacy: diagnostics stored before"), std::string::npos) << *md;
  auto csv_doc = report::ResultsCsv(doc);
  ASSERT_TRUE(csv_doc.ok());
  EXPECT_NE(csv_doc->find(",per_token,"), std::string::npos) << *csv_doc;
  EXPECT_NE(csv_doc->find(",legacy,"), std::string::npos) << *csv_doc;
}

}  // namespace
}  // namespace depthbench::cli
