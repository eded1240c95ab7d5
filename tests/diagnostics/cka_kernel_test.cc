// The D_eff CKA kernel (trainer_core/diagnostics/cka_kernel.h, issue 18 goal
// 1): both formulations and both precisions against the float64 pairwise
// reference (LinearCka), the memory-mapped .npy path for float32 and float64
// files, the paper's Table S1 figures for independent states, the progress /
// perf lines, and that the mapped file does not stay in the resident set.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cuda_ops/cpu_gemm.h"
#include "tests/common/test_util.h"
#include "trainer_core/diagnostics/cka_kernel.h"
#include "trainer_core/diagnostics/deff_npy.h"
#include "trainer_core/diagnostics/metrics.h"
#include "trainer_core/diagnostics/npy.h"
#include "trainer_core/npy.h"

namespace depthbench {
namespace diagnostics {
namespace {

using ::depthbench::testing::RunCommand;
using ::depthbench::testing::TempDir;

// L correlated layers [N, d_l]: a random walk in a shared feature space (so
// CKA falls with the lag) plus a per-layer column offset `mean`.
std::vector<torch::Tensor> Walk(const std::vector<int64_t>& dims, int64_t n,
                                double mean, uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> out;
  torch::Tensor h = torch::randn({n, 64}, torch::kFloat64);
  for (size_t l = 0; l < dims.size(); ++l) {
    h = h + 0.6 * torch::randn({n, 64}, torch::kFloat64);
    torch::Tensor proj = torch::randn({64, dims[l]}, torch::kFloat64);
    out.push_back(h.matmul(proj) + mean * (static_cast<double>(l) + 1) +
                  0.3 * torch::randn({n, dims[l]}, torch::kFloat64));
  }
  return out;
}

Matrix Reference(const std::vector<torch::Tensor>& layers) {
  const size_t l = layers.size();
  Matrix m(l, std::vector<double>(l, 1.0));
  for (size_t i = 0; i < l; ++i) {
    for (size_t j = i + 1; j < l; ++j) {
      auto v = LinearCka(layers[i], layers[j]);
      EXPECT_TRUE(v.ok()) << v.status();
      m[i][j] = m[j][i] = v.ok() ? *v : NAN;
    }
  }
  return m;
}

void ExpectClose(const Matrix& got, const Matrix& want, double tol,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    for (size_t j = 0; j < want.size(); ++j) {
      EXPECT_NEAR(got[i][j], want[i][j], tol) << what << " (" << i << ", " << j
                                              << ")";
    }
  }
}

struct Case {
  CkaForm form;
  CkaPrecision precision;
  int64_t tile_rows;     // gram: ragged tiles when N % tile != 0
  int64_t budget_bytes;  // feature: small budget = blocks of few layers
  double tol;
  bool syrk = true;  // gram: diagonal tiles by the BLAS's syrk if present
};

TEST(CkaKernelTest, BothFormsAndPrecisionsMatchTheFloat64Reference) {
  const std::vector<int64_t> dims = {40, 40, 24, 56, 40, 32};
  const int64_t n = 300;
  for (double mean : {0.0, 20.0}) {
    const std::vector<torch::Tensor> layers = Walk(dims, n, mean, 7);
    const Matrix want = Reference(layers);
    // Layers 1 and 6 are far apart, neighbours close: not a trivial matrix.
    EXPECT_LT(want[0][5], want[0][1]);
    const int64_t layer_bytes = n * 56 * 4;
    const std::vector<Case> cases = {
        {CkaForm::kGram, CkaPrecision::kFloat64, 64, kCkaDefaultBudgetBytes, 1e-12},
        {CkaForm::kGram, CkaPrecision::kFloat64, 0, kCkaDefaultBudgetBytes, 1e-12},
        {CkaForm::kFeature, CkaPrecision::kFloat64, 0, 3 * layer_bytes * 2, 1e-12},
        {CkaForm::kGram, CkaPrecision::kFloat32, 128, kCkaDefaultBudgetBytes, 2e-5},
        // Full GEMMs on the diagonal tiles (the path without a syrk), and
        // an odd tile size (the middle row of the upper-triangle split).
        {CkaForm::kGram, CkaPrecision::kFloat64, 64, kCkaDefaultBudgetBytes, 1e-12, false},
        {CkaForm::kGram, CkaPrecision::kFloat32, 128, kCkaDefaultBudgetBytes, 2e-5, false},
        {CkaForm::kGram, CkaPrecision::kFloat32, 77, kCkaDefaultBudgetBytes, 2e-5},
        {CkaForm::kGram, CkaPrecision::kFloat64, 77, kCkaDefaultBudgetBytes, 1e-12},
        {CkaForm::kFeature, CkaPrecision::kFloat32, 0, 3 * layer_bytes, 2e-5},
        {CkaForm::kFeature, CkaPrecision::kFloat32, 0, kCkaDefaultBudgetBytes, 2e-5},
    };
    for (const Case& c : cases) {
      // float32 copies of the states as the kernel's input where the
      // precision is float32 (what a float32 file gives it).
      std::vector<torch::Tensor> in;
      for (const auto& t : layers) {
        in.push_back(c.precision == CkaPrecision::kFloat32
                         ? t.to(torch::kFloat32)
                         : t);
      }
      const Matrix ref = c.precision == CkaPrecision::kFloat32
                             ? Reference(in)  // same rounding of the input
                             : want;
      TensorLayerRows rows(in);
      CkaOptions options;
      options.form = c.form;
      options.precision = c.precision;
      options.tile_rows = c.tile_rows;
      options.budget_bytes = c.budget_bytes;
      options.diagonal_syrk = c.syrk;
      int64_t calls = 0;
      options.progress = [&](const CkaProgress& p) {
        ++calls;
        EXPECT_LE(p.done_steps, p.total_steps);
      };
      auto got = LinearCkaMatrix(rows, options, "test");
      ASSERT_TRUE(got.ok()) << got.status();
      const std::string what = std::string(CkaFormName(c.form)) + " " +
                               CkaPrecisionName(c.precision) + " tile " +
                               std::to_string(c.tile_rows) + " mean " +
                               std::to_string(mean) + " " + got->diagonal_tiles;
      EXPECT_EQ(got->plan.form, c.form) << what;
      EXPECT_EQ(got->plan.precision, c.precision) << what;
      if (c.form == CkaForm::kFeature && c.budget_bytes < kCkaDefaultBudgetBytes) {
        EXPECT_LT(got->plan.block_layers, 6) << what;  // several blocks
      }
      if (c.tile_rows > 0) {
        EXPECT_EQ(got->plan.tile_rows, c.tile_rows);
      }
      const bool syrk = c.form == CkaForm::kGram && c.syrk &&
                        !CkaSyrkSource().empty();
      EXPECT_EQ(got->plan.diagonal_syrk, syrk) << what;
      if (c.form == CkaForm::kGram) {
        EXPECT_EQ(got->diagonal_tiles.rfind(syrk ? "syrk: " : "gemm: ", 0), 0u)
            << what;
      }
      EXPECT_GT(calls, 0) << what;
      ExpectClose(got->cka, ref, c.tol, what);
    }
  }
}

TEST(CkaKernelTest, PlanPicksTheFormWithFewerFlops) {
  // The shape: gram 3.38 TFLOP with syrk on the diagonal tiles
  // (3.28 for the (N^2 + N) / 2 Gram entries, 0.10 for the contraction),
  // 3.75 without (the full diagonal tiles: 9 equal tiles of 1,120 rows);
  // feature 11.1 TFLOP; float32; small buffers (a few layers of 41 MB
  // each, not the 1.3 GB file).
  const CkaPlan big = PlanCkaUniform(32, 10000, 1024);
  EXPECT_EQ(big.form, CkaForm::kGram);
  EXPECT_EQ(big.precision, CkaPrecision::kFloat32);
  EXPECT_EQ(big.tile_rows, 1120);
  EXPECT_EQ(big.diagonal_syrk, !CkaSyrkSource().empty());
  EXPECT_NEAR(big.gram_flops / 1e12, big.diagonal_syrk ? 3.38 : 3.75, 0.01);
  CkaOptions no_syrk;
  no_syrk.diagonal_syrk = false;
  const CkaPlan gemm_diag = PlanCkaUniform(32, 10000, 1024, no_syrk);
  EXPECT_FALSE(gemm_diag.diagonal_syrk);
  EXPECT_NEAR(gemm_diag.gram_flops / 1e12, 3.75, 0.01);
  EXPECT_NEAR(big.feature_flops / 1e12, 11.1, 0.1);
  EXPECT_LT(big.working_bytes, int64_t{256} << 20);
  // Many sequences, few narrow layers: the d x d form is cheaper.
  const CkaPlan tall = PlanCkaUniform(4, 100000, 64);
  EXPECT_EQ(tall.form, CkaForm::kFeature);
  EXPECT_LT(tall.feature_flops, tall.gram_flops);
  // Small runs stay in float64.
  EXPECT_EQ(PlanCkaUniform(6, 12, 16).precision, CkaPrecision::kFloat64);
  CkaOptions forced;
  forced.precision = CkaPrecision::kFloat32;
  EXPECT_EQ(PlanCkaUniform(6, 12, 16, forced).precision, CkaPrecision::kFloat32);
}

TEST(CkaKernelTest, RefusesZeroVarianceAndNonFiniteLayers) {
  std::vector<torch::Tensor> layers = Walk({8, 8, 8}, 20, 0.0, 3);
  layers[1] = torch::full({20, 8}, 3.0, torch::kFloat64);
  TensorLayerRows rows(layers);
  auto got = LinearCkaMatrix(rows, {}, "test");
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("layer 2: zero variance"),
            std::string::npos)
      << got.status();
  layers[1] = Walk({8}, 20, 0.0, 4)[0];
  layers[2][3][4] = NAN;
  TensorLayerRows rows2(layers);
  got = LinearCkaMatrix(rows2, {}, "test");
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("layer 3: non-finite"),
            std::string::npos)
      << got.status();
}

// (L, N, d) file from [N, d] float64 layers, as '<f4' or '<f8'.
std::string WriteStates(const std::string& path,
                        const std::vector<torch::Tensor>& layers,
                        bool float64) {
  torch::Tensor all = torch::stack(layers).contiguous();
  const std::vector<int64_t> shape(all.sizes().begin(), all.sizes().end());
  if (float64) {
    EXPECT_TRUE(WriteNpy(path, {"<f8", 8}, shape,
                         std::string_view(static_cast<const char*>(all.data_ptr()),
                                          all.numel() * 8))
                    .ok());
  } else {
    torch::Tensor f = all.to(torch::kFloat32).contiguous();
    std::vector<float> data(f.data_ptr<float>(), f.data_ptr<float>() + f.numel());
    EXPECT_TRUE(WriteNpyFloat32(path, shape, data).ok());
  }
  return path;
}

TEST(CkaKernelTest, MappedFloat32AndFloat64FilesGiveTheReference) {
  TempDir dir;
  const std::vector<torch::Tensor> layers = Walk({48, 48, 48, 48, 48}, 200, 1.0, 11);
  auto in_memory = EffectiveDepth(layers);  // float64 reference
  ASSERT_TRUE(in_memory.ok()) << in_memory.status();
  // float64 file: the same numbers exactly.
  const std::string f8 = WriteStates(dir.path() + "/s8.npy", layers, true);
  auto got8 = DeffFromNpy(f8);
  ASSERT_TRUE(got8.ok()) << got8.status();
  EXPECT_NEAR((*got8)["deff"].get<double>(), in_memory->deff, 1e-12);
  EXPECT_EQ((*got8)["perf"]["precision"], "fp64");
  for (size_t i = 0; i < 5; ++i) {
    for (size_t j = 0; j < 5; ++j) {
      EXPECT_NEAR((*got8)["cka"][i][j].get<double>(), in_memory->cka[i][j],
                  1e-12);
    }
  }
  // float32 file, float64 and float32 GEMMs: the reference up to the
  // float32 rounding of the states (and of the GEMMs).
  const std::string f4 = WriteStates(dir.path() + "/s4.npy", layers, false);
  for (CkaPrecision p : {CkaPrecision::kFloat64, CkaPrecision::kFloat32}) {
    DeffNpyOptions options;
    options.cka.precision = p;
    auto got4 = DeffFromNpy(f4, options);
    ASSERT_TRUE(got4.ok()) << got4.status();
    EXPECT_EQ((*got4)["perf"]["precision"], CkaPrecisionName(p));
    EXPECT_NEAR((*got4)["deff"].get<double>(), in_memory->deff, 1e-4);
    EXPECT_NEAR((*got4)["rho_bar1"].get<double>(), in_memory->rho_bar1, 2e-5);
  }
  // The gram form reads its row blocks with pread (ReadRows) when the file
  // holds the compute dtype and views the mapping otherwise: every
  // combination, over several tiles, gives the reference.
  for (const std::string& file : {f8, f4}) {
    for (CkaPrecision p : {CkaPrecision::kFloat64, CkaPrecision::kFloat32}) {
      SCOPED_TRACE(file + " " + CkaPrecisionName(p));
      DeffNpyOptions options;
      options.cka.precision = p;
      options.cka.form = CkaForm::kGram;
      options.cka.tile_rows = 48;  // 5 row blocks, the last one short
      auto got = DeffFromNpy(file, options);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ((*got)["perf"]["form"], "gram");
      const double tol = file == f8 && p == CkaPrecision::kFloat64 ? 1e-12 : 1e-4;
      EXPECT_NEAR((*got)["deff"].get<double>(), in_memory->deff, tol);
      for (size_t i = 0; i < 5; ++i) {
        for (size_t j = 0; j < 5; ++j) {
          EXPECT_NEAR((*got)["cka"][i][j].get<double>(), in_memory->cka[i][j], tol);
        }
      }
    }
  }
  // A dtype the kernel does not read is refused naming what it accepts.
  std::vector<int32_t> ints(2 * 3 * 4, 1);
  const std::string i4 = dir.path() + "/i4.npy";
  ASSERT_TRUE(WriteNpy(i4, {"<i4", 4}, {2, 3, 4},
                       std::string_view(reinterpret_cast<const char*>(ints.data()),
                                        ints.size() * 4))
                  .ok());
  auto bad = DeffFromNpy(i4);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'<f4' little-endian float32, '<f8' float64"),
            std::string::npos)
      << bad.status();
}

// Table S1 of the D_eff paper: independent random states (N = 10,000
// sequences, d = 1,024) give D_eff/L = 0.258 and rho(1) = 0.093 at L = 32.
// CKA of independent states depends on d/N (about d/(N+d)), so the same
// ratio at a quarter of the size (N = 2,500, d = 256) must give the same
// figures; through the mapped float32 path and float32 GEMMs.
TEST(CkaKernelTest, IndependentStatesGiveTableS1) {
  TempDir dir;
  torch::manual_seed(2026);
  const std::string path = dir.path() + "/independent.npy";
  {
    torch::Tensor states = torch::randn({32, 2500, 256});
    std::vector<float> data(states.data_ptr<float>(),
                            states.data_ptr<float>() + states.numel());
    ASSERT_TRUE(WriteNpyFloat32(path, {32, 2500, 256}, data).ok());
  }
  auto got = DeffFromNpy(path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)["perf"]["precision"], "fp32");
  EXPECT_EQ((*got)["perf"]["form"], "gram");
  EXPECT_NEAR((*got)["rho_bar1"].get<double>(), 0.093, 0.002);
  EXPECT_NEAR((*got)["deff_over_l"].get<double>(), 0.258, 0.004);
  EXPECT_NEAR((*got)["rho_bar1"].get<double>(), 256.0 / (2500 + 256), 0.002);
}

TEST(CkaKernelTest, ProgressAndPerfLines) {
  TempDir dir;
  const std::string path = WriteStates(
      dir.path() + "/s.npy", Walk({32, 32, 32, 32}, 400, 0.0, 5), false);
  DeffNpyOptions options;
  options.cka.tile_rows = 64;  // 28 tiles x 4 layers = 112 steps
  options.cka.precision = CkaPrecision::kFloat32;
  options.cka.form = CkaForm::kGram;
  std::ostringstream log;
  options.log = &log;
  options.progress_interval_s = 0.0;  // a line per step
  options.perf = true;
  auto got = DeffFromNpy(path, options);
  ASSERT_TRUE(got.ok()) << got.status();
  const std::string text = log.str();
  EXPECT_NE(text.find("deff: 112/112 GEMM steps (100.0%"), std::string::npos)
      << text;
  EXPECT_NE(text.find("ETA"), std::string::npos) << text;
  EXPECT_NE(text.find("deff: done in"), std::string::npos) << text;
  EXPECT_NE(text.find("of the sgemm peak"), std::string::npos) << text;
  const auto& perf = (*got)["perf"];
  EXPECT_GT(perf["sgemm_peak_gflops"].get<double>(), 0.0);
  EXPECT_GT(perf["fraction_of_peak"].get<double>(), 0.0);
  EXPECT_GT(perf["peak_rss_mib"].get<double>(), 0.0);
  EXPECT_EQ(perf["tile_rows"], 64);
  // Where the time went: every phase ran, and they add up to (at most) the
  // whole call.
  double phase_sum = 0;
  for (const char* phase : {"means", "centre", "gemm", "contract"}) {
    const double seconds = perf["phase_seconds"][phase].get<double>();
    EXPECT_GT(seconds, 0.0) << phase;
    phase_sum += seconds;
  }
  EXPECT_LE(phase_sum, perf["seconds"].get<double>());
  // Which path the diagonal tiles took, in the JSON and on the done line.
  const std::string diag = perf["diagonal_tiles"].get<std::string>();
  EXPECT_EQ(diag.rfind(CkaSyrkSource().empty() ? "gemm: " : "syrk: ", 0), 0u)
      << diag;
  EXPECT_NE(text.find("diagonal tiles by " + diag), std::string::npos) << text;
  // A short run prints nothing and does not measure the peak.
  std::ostringstream quiet;
  options.log = &quiet;
  options.progress_interval_s = 1e9;
  options.perf = false;
  auto short_run = DeffFromNpy(path, options);
  ASSERT_TRUE(short_run.ok()) << short_run.status();
  EXPECT_EQ(quiet.str(), "");
  EXPECT_FALSE((*short_run)["perf"].contains("sgemm_peak_gflops"));
  // The command line prints the perf line on stderr with --perf.
  std::string out;
  ASSERT_EQ(RunCommand(std::string("'") + DEPTHBENCH_DEFF_BIN + "' --states '" +
                           path + "' --perf --threads 1",
                       &out),
            0)
      << out;
  EXPECT_NE(out.find("deff: done in"), std::string::npos) << out;
  EXPECT_NE(out.find("1 threads"), std::string::npos) << out;
}

int64_t ReadStatusKib(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) {
      return std::stoll(line.substr(key.size() + 1));
    }
  }
  return -1;
}

// The float32 GEMMs of both forms through oneDNN's sgemm where the trainer
// uses it (cpu_gemm::Enabled()) and through at::mm with onednn_gemm off:
// the same CKA up to float32 rounding, each saying which library ran. The
// feature form's GEMMs read transposed views (x_i^T x_j), the gram form's
// diagonal tiles run as full GEMMs with syrk off.
TEST(CkaKernelTest, Float32GemmsOnOneDnnMatchAtMm) {
  if (!cpu_gemm::Enabled()) {
    GTEST_SKIP() << "oneDNN sgemm not in use: " << cpu_gemm::Description()
                 << " (the at::mm path runs in every other test)";
  }
  const std::vector<int64_t> dims = {40, 24, 56, 40};
  std::vector<torch::Tensor> layers;
  for (const auto& t : Walk(dims, 300, 10.0, 5)) layers.push_back(t.to(torch::kFloat32));
  const Matrix want = Reference(layers);
  TensorLayerRows rows(layers);
  for (CkaForm form : {CkaForm::kGram, CkaForm::kFeature}) {
    for (bool syrk : {true, false}) {
      Matrix got[2];
      for (bool onednn : {false, true}) {
        SCOPED_TRACE(std::string(CkaFormName(form)) + (syrk ? " syrk" : " no syrk") +
                     (onednn ? " oneDNN" : " at::mm"));
        CkaOptions options;
        options.form = form;
        options.precision = CkaPrecision::kFloat32;
        options.tile_rows = form == CkaForm::kGram ? 128 : 0;
        options.diagonal_syrk = syrk;
        options.onednn_gemm = onednn;
        auto r = LinearCkaMatrix(rows, options, "test");
        ASSERT_TRUE(r.ok()) << r.status();
        if (onednn) {
          EXPECT_EQ(r->gemm, "oneDNN sgemm");
        } else {
          EXPECT_EQ(r->gemm.rfind("at::mm", 0), 0u) << r->gemm;
        }
        if (form == CkaForm::kGram && !syrk) {
          EXPECT_NE(r->diagonal_tiles.find(r->gemm), std::string::npos) << r->diagonal_tiles;
        }
        ExpectClose(r->cka, want, 2e-5, "vs the float64 reference");
        got[onednn] = r->cka;
      }
      ExpectClose(got[1], got[0], 2e-5, "oneDNN vs at::mm");
    }
  }
  // float64 never takes oneDNN's sgemm.
  CkaOptions options;
  options.precision = CkaPrecision::kFloat64;
  auto r = LinearCkaMatrix(rows, options, "test");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->gemm, "at::mm");
}

// In-memory tensors (TensorLayerRows) that also offer ReadRows, like the
// mapped .npy file: it logs every read (from whichever thread) and can
// refuse the reads of one layer that do not start a tile row block, after
// the kernel has begun filling that block.
class PieceReader : public TensorLayerRows {
 public:
  PieceReader(std::vector<torch::Tensor> layers, int64_t tile, int64_t fail_layer)
      : TensorLayerRows(std::move(layers)), tile_(tile), fail_layer_(fail_layer) {}
  bool ReadRows(int64_t layer, int64_t r0, int64_t r1, torch::Tensor& dst) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      reads_.push_back({layer, r0, r1});
      threads_.insert(std::this_thread::get_id());
    }
    if (layer == fail_layer_ && r0 % tile_ != 0) return false;
    dst.copy_(Rows(layer, r0, r1));
    return true;
  }
  struct Read {
    int64_t layer, r0, r1;
  };
  std::vector<Read> reads_;
  std::set<std::thread::id> threads_;

 private:
  int64_t tile_, fail_layer_;
  std::mutex mu_;
};

// The gram form reads a block through ReadRows in pieces of 256 KiB (here
// 512 rows of d = 128 floats), centring each piece as it lands, on several
// threads at once. Same values as centring the whole block from a view
// (TensorLayerRows): the same x - mu per element, so the CKA matrices are
// equal exactly; a piece refused midway sends that block back to the view.
TEST(CkaKernelTest, PieceReadsOnSeveralThreadsMatchTheBlockPath) {
  const int64_t n = 3000, d = 128, tile = 1504;  // blocks of 1,504 and 1,496 rows
  std::vector<torch::Tensor> layers;
  for (const auto& t : Walk({d, d, d}, n, 5.0, 11)) layers.push_back(t.to(torch::kFloat32));
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  CkaOptions options;
  options.form = CkaForm::kGram;
  options.precision = CkaPrecision::kFloat32;
  options.tile_rows = tile;
  TensorLayerRows view(layers);
  auto want = LinearCkaMatrix(view, options, "view");
  ASSERT_TRUE(want.ok()) << want.status();
  for (int64_t fail_layer : {-1, 1}) {
    SCOPED_TRACE("refusing layer " + std::to_string(fail_layer));
    PieceReader reader(layers, tile, fail_layer);
    auto got = LinearCkaMatrix(reader, options, "pieces");
    ASSERT_TRUE(got.ok()) << got.status();
    for (size_t i = 0; i < 3; ++i) {
      for (size_t j = 0; j < 3; ++j) {
        EXPECT_EQ(got->hsic[i][j], want->hsic[i][j]) << i << ", " << j;
        EXPECT_EQ(got->cka[i][j], want->cka[i][j]) << i << ", " << j;
      }
    }
    // Every block of every layer was read whole, in pieces of at most 512
    // rows: 1,504 rows = 512 + 512 + 480 (the means pass reads its own
    // chunks first: 4,096 rows of d = 128, so the whole layer at once).
    std::map<std::pair<int64_t, int64_t>, int64_t> rows_read;  // (layer, block) -> rows
    int64_t pieces = 0;
    for (const auto& r : reader.reads_) {
      if (r.r1 - r.r0 == n) continue;  // the means pass
      ++pieces;
      EXPECT_LE(r.r1 - r.r0, 512) << "layer " << r.layer << " rows " << r.r0;
      EXPECT_EQ(r.r0 / tile, (r.r1 - 1) / tile) << "a piece across blocks at " << r.r0;
      rows_read[{r.layer, r.r0 / tile}] += r.r1 - r.r0;
    }
    EXPECT_GT(pieces, 0);
    for (int64_t l = 0; l < 3; ++l) {
      if (l == fail_layer) continue;
      // Blocks (0, 0), (0, 1), (1, 1): block 0 read twice, block 1 twice.
      EXPECT_EQ(rows_read[std::make_pair(l, int64_t{0})], 2 * tile) << "layer " << l;
      EXPECT_EQ(rows_read[std::make_pair(l, int64_t{1})], 2 * (n - tile)) << "layer " << l;
    }
    if (at::get_num_threads() >= 2) {
      EXPECT_GE(reader.threads_.size(), 2u) << "pieces read on one thread only";
    }
  }
  at::set_num_threads(threads);
}

// A 256 MiB file read twice (means, then the tiles) must not stay in the
// resident set: the peak RSS (VmHWM, reset through /proc/self/clear_refs)
// grows by the kernel's buffers, well under the file size. N = 64 keeps the
// arithmetic small (9 GFLOP).
TEST(CkaKernelTest, MappedFileDoesNotStayResident) {
  TempDir dir;
  const std::string path = dir.path() + "/wide.npy";
  const int64_t layers = 16, n = 64, d = int64_t{1} << 16;
  {
    torch::manual_seed(1);
    torch::Tensor states = torch::randn({layers, n, d});
    std::vector<float> data(states.data_ptr<float>(),
                            states.data_ptr<float>() + states.numel());
    states = torch::Tensor();
    ASSERT_TRUE(WriteNpyFloat32(path, {layers, n, d}, data).ok());
  }
  {
    std::ofstream reset("/proc/self/clear_refs");
    reset << "5";
    reset.close();
    if (!reset) GTEST_SKIP() << "cannot reset the peak RSS through /proc/self/clear_refs";
  }
  const int64_t before = ReadStatusKib("VmHWM");
  const int64_t rss = ReadStatusKib("VmRSS");
  if (before < 0 || before > rss + 1024) {
    GTEST_SKIP() << "VmHWM was not reset (VmHWM " << before << " kB, VmRSS "
                 << rss << " kB)";
  }
  DeffNpyOptions options;
  options.cka.precision = CkaPrecision::kFloat32;
  auto got = DeffFromNpy(path, options);
  ASSERT_TRUE(got.ok()) << got.status();
  const int64_t growth_mib = (ReadStatusKib("VmHWM") - before) / 1024;
  const int64_t file_mib = layers * n * d * 4 >> 20;
  std::cout << "peak RSS grew by " << growth_mib << " MiB on a " << file_mib
            << " MiB file\n";
  EXPECT_LT(growth_mib, file_mib / 2)
      << "peak RSS grew by " << growth_mib << " MiB on a " << file_mib
      << " MiB file";
}

}  // namespace
}  // namespace diagnostics
}  // namespace depthbench
