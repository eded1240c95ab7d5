// The CLI's bridge from QueryResults to the report: diagnostics summaries
// (R_causal, R_perm, D_eff/L) and a results.v1 document the report library
// accepts, from a hand-made response.
#include "cli/results_doc.h"

#include <gtest/gtest.h>

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

TEST(ResultsDocTest, BuildsAValidResultsDocument) {
  v1::QueryResultsResponse resp;
  v1::ResultRow* row = resp.add_rows();
  row->set_arch("pre_ln");
  row->set_layers(2);
  row->set_d_model(64);
  row->set_aspect_ratio(32);
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

}  // namespace
}  // namespace depthbench::cli
