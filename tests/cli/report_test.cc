#include "cli/report/report.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <set>
#include <string>

namespace depthbench {
namespace report {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

json Sample() {
  std::ifstream in(std::string(DEPTHBENCH_TESTDATA_DIR) +
                   "/report_sample.json");
  return json::parse(in);
}

std::string Slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fs::path FreshDir(const std::string& name) {
  fs::path dir = fs::path(::testing::TempDir()) / ("report_test_" + name);
  fs::remove_all(dir);
  return dir;
}

json Minimal() {
  return json::parse(R"({"sweep": "s", "rows": [
      {"arch": "pre_ln", "layers": 4, "d_model": 64, "val_loss": 3.0,
       "best_lr": 0.002, "lr_losses": {"0.002": 3.0, "0.004": null}}]})");
}

TEST(ReportTest, ValidationNamesTheField) {
  EXPECT_TRUE(ValidateResults(Sample()).ok()) << ValidateResults(Sample());
  EXPECT_TRUE(ValidateResults(Minimal()).ok());
  struct Case {
    const char* pointer;
    json value;
    const char* want;
  };
  const Case cases[] = {
      {"/sweep", 3, "sweep"},
      {"/rows/0/layers", 0, "rows[0].layers"},
      {"/rows/0/arch", "", "rows[0].arch"},
      {"/rows/0/val_loss", "low", "rows[0].val_loss"},
      {"/rows/0/lr_losses", json{{"fast", 1.0}}, "lr_losses"},
      {"/rows/0/diagnostics", json{{"causal", json{{1, 2}, {3}}}},
       "not rectangular"},
      {"/rows/0/diagnostics", json{{"perm", json{{1, "x"}}}}, "perm[0][1]"},
      {"/curves", json{{"r", json{{1}}}}, "curves[\"r\"][0]"},
      {"/schema", "v0", "schema"},
  };
  for (const Case& c : cases) {
    json doc = Minimal();
    doc[json::json_pointer(c.pointer)] = c.value;
    absl::Status s = ValidateResults(doc);
    ASSERT_FALSE(s.ok()) << c.pointer;
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(s.message()).find(c.want), std::string::npos)
        << s << " (wanted " << c.want << ")";
  }
  EXPECT_FALSE(ValidateResults(json::array()).ok());
  json no_rows = Minimal();
  no_rows.erase("rows");
  EXPECT_FALSE(ValidateResults(no_rows).ok());
}

TEST(ReportTest, CsvHasLrColumnsAndDivergence) {
  auto csv = ResultsCsv(Minimal());
  ASSERT_TRUE(csv.ok()) << csv.status();
  EXPECT_EQ(*csv,
            "sweep,arch,layers,d_model,aspect_ratio,params,tokens,steps,best_lr,val_loss,"
            "diag_lr,r_causal,causal_form,r_perm,deff_over_l,deff_n,legacy,run_id,"
            "loss@lr=0.002,loss@lr=0.004\n"
            "s,pre_ln,4,64,16.0000,,,,0.002,3.000000,,,,,,,,,3.000000,diverged\n");
  auto all = ResultsCsv(Sample());
  ASSERT_TRUE(all.ok());
  // deepnorm: every LR diverged.
  EXPECT_NE(all->find("demo,deepnorm,8,176,22.0000,,,,,diverged"),
            std::string::npos)
      << *all;
}

TEST(ReportTest, MarkdownTables) {
  auto md = ResultsMarkdown(Sample());
  ASSERT_TRUE(md.ok()) << md.status();
  EXPECT_NE(md->find("| arch | L | d_model | d/L |"), std::string::npos);
  EXPECT_NE(md->find("| full_attnres | 8 | 176 | 22.00 |"), std::string::npos)
      << *md;
  EXPECT_NE(md->find("16.0%"), std::string::npos);  // R_causal full_attnres
  // Pivot: best shape of full_attnres (L=8, 2.718) is bold.
  EXPECT_NE(md->find("**2.7180**"), std::string::npos) << *md;
  EXPECT_NE(md->find("| L=4 | L=6 | L=8 |"), std::string::npos) << *md;
}

TEST(ReportTest, MissingGnuplotIsAClearErrorAndTablesAreStillWritten) {
  const fs::path dir = FreshDir("nognuplot");
  ReportOptions opts;
  opts.gnuplot = "/nonexistent/bin/gnuplot";
  auto s = WriteReport(Sample(), dir.string(), opts);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(s.status().message()).find("gnuplot"),
            std::string::npos);
  for (const char* f : {"results.csv", "results.json", "results.md"}) {
    EXPECT_TRUE(fs::exists(dir / f)) << f;
  }
  EXPECT_FALSE(fs::exists(dir / "val_loss_vs_aspect.png"));
}

TEST(ReportTest, TablesOnlyNeedsNoGnuplot) {
  const fs::path dir = FreshDir("tables");
  ReportOptions opts;
  opts.gnuplot = "/nonexistent/bin/gnuplot";
  opts.plots = false;
  auto s = WriteReport(Minimal(), dir.string(), opts);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->files, (std::vector<std::string>{"results.csv", "results.json",
                                                "results.md"}));
  const json back = json::parse(Slurp(dir / "results.json"));
  EXPECT_EQ(back["schema"], kResultsSchema);
  EXPECT_DOUBLE_EQ(back["rows"][0]["aspect_ratio"].get<double>(), 16.0);
}

TEST(ReportTest, WritesEveryFile) {
  if (!DetectPngTerminal("gnuplot").ok()) {
    GTEST_SKIP() << "gnuplot not installed";
  }
  const fs::path dir = FreshDir("full");
  auto s = WriteReport(Sample(), dir.string());
  ASSERT_TRUE(s.ok()) << s.status();
  std::vector<std::string> want = {"results.csv", "results.json", "results.md",
                                   "val_loss_vs_aspect"};
  for (const char* arch : {"pre_ln", "full_attnres", "hc"}) {
    for (int l : {4, 6, 8}) {
      const std::string stem = std::string(arch) + "_L" + std::to_string(l);
      for (const char* kind : {"angular_", "causal_", "perm_"}) {
        want.push_back(kind + stem);
      }
      want.push_back("loss_" + std::string(arch) + "-L" + std::to_string(l) +
                     "-lr0.002");
    }
  }
  for (const std::string& f : want) {
    if (f.rfind("results.", 0) == 0) {
      EXPECT_GT(fs::file_size(dir / f), 0u) << f;
      continue;
    }
    const std::string png = Slurp(dir / (f + ".png"));
    ASSERT_GT(png.size(), 1000u) << f;
    EXPECT_EQ(png.substr(1, 3), "PNG") << f;
    const std::string svg = Slurp(dir / (f + ".svg"));
    EXPECT_NE(svg.find("<svg"), std::string::npos) << f;
    EXPECT_TRUE(fs::exists(dir / "gnuplot" / (f + ".gp"))) << f;
  }
  // No heatmap for the deepnorm row (no diagnostics), and the listing is
  // complete: 3 tables + 37 figures x (png, svg, gp) + 37 data files.
  EXPECT_FALSE(fs::exists(dir / "angular_deepnorm_L8.png"));
  EXPECT_EQ(s->files.size(), 3u + 37u * 4u);
  const std::string md = Slurp(dir / "results.md");
  EXPECT_NE(md.find("[val_loss_vs_aspect.png](val_loss_vs_aspect.png)"),
            std::string::npos);
}

// One colour scale per diagnostic across the report (issue 12): every
// causal heatmap's script sets the same cbrange, the report-wide maximum,
// whatever each design's own range is.
TEST(ReportTest, HeatmapsOfOneDiagnosticShareOneColourScale) {
  if (!DetectPngTerminal("gnuplot").ok()) {
    GTEST_SKIP() << "gnuplot not installed";
  }
  json doc = Sample();
  // Give one row a much larger causal range than the others.
  doc["rows"][3]["diagnostics"]["causal"][0][1] = 7.5;
  const fs::path dir = FreshDir("scale");
  auto s = WriteReport(doc, dir.string());
  ASSERT_TRUE(s.ok()) << s.status();
  for (const char* kind : {"angular_", "causal_", "perm_"}) {
    std::set<std::string> ranges;
    for (const char* stem : {"pre_ln_L4", "pre_ln_L8", "full_attnres_L6", "hc_L8"}) {
      const std::string gp = Slurp(dir / "gnuplot" / (std::string(kind) + stem + ".gp"));
      const size_t at = gp.find("set cbrange [0:");
      ASSERT_NE(at, std::string::npos) << kind << stem;
      ranges.insert(gp.substr(at, gp.find('\n', at) - at));
    }
    EXPECT_EQ(ranges.size(), 1u) << kind;
    if (std::string(kind) == "causal_") {
      EXPECT_EQ(*ranges.begin(), "set cbrange [0:7.5]");
    }
  }
}

}  // namespace
}  // namespace report
}  // namespace depthbench
