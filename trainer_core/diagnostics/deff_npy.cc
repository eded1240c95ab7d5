#include "trainer_core/diagnostics/deff_npy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/blas_tuning.h"
#include "common/status_macros.h"
#include "trainer_core/diagnostics/cka_kernel.h"
#include "trainer_core/diagnostics/metrics.h"
#include "trainer_core/diagnostics/result_json.h"
#include "trainer_core/npy.h"

namespace depthbench {
namespace diagnostics {
namespace {



using Clock = std::chrono::steady_clock;

NpyExpectation StatesArray() {
  NpyExpectation expect;
  expect.dtypes = {{"<f4", 4}, {"<f8", 8}};
  expect.dtypes_help = "'<f4' little-endian float32, '<f8' float64";
  expect.file_noun = "states file";
  return expect;
}

bool HostIsLittleEndian() {
  const uint16_t probe = 1;
  unsigned char first = 0;
  std::memcpy(&first, &probe, 1);
  return first == 1;
}

// The (L, N, d) array of a .npy file, mapped read-only. Rows() are views of
// the mapping; Release() hands the pages used so far back (MADV_DONTNEED on
// a read-only file mapping drops them from the RSS; they stay in the page
// cache and fault back in if read again). ReadRows() copies a block into the
// kernel's buffer with pread instead, mapping nothing (the gram form's
// centring, which re-reads each block once per tile).
class MappedStates : public LayerRows {
 public:
  static absl::StatusOr<std::unique_ptr<MappedStates>> Open(
      const std::string& path, const NpyLayout& layout, int64_t file_size) {
    if (!HostIsLittleEndian()) {
      return absl::UnimplementedError(
          "deff: memory-mapping little-endian .npy data needs a little-endian "
          "host");
    }
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return absl::InternalError(absl::StrCat("deff: cannot open ", path, ": ",
                                              std::strerror(errno)));
    }
    void* base = ::mmap(nullptr, static_cast<size_t>(file_size), PROT_READ,
                        MAP_PRIVATE, fd, 0);
    const int err = errno;
    if (base == MAP_FAILED) {
      ::close(fd);
      return absl::InternalError(absl::StrCat("deff: cannot map ", path, ": ",
                                              std::strerror(err)));
    }
    return std::unique_ptr<MappedStates>(
        new MappedStates(base, file_size, fd, layout));
  }
  ~MappedStates() override {
    ::munmap(base_, static_cast<size_t>(size_));
    ::close(fd_);
  }
  MappedStates(const MappedStates&) = delete;
  MappedStates& operator=(const MappedStates&) = delete;

  int64_t num_layers() const override { return layout_.shape[0]; }
  int64_t num_rows() const override { return layout_.shape[1]; }
  int64_t dim(int64_t) const override { return layout_.shape[2]; }
  torch::Tensor Rows(int64_t layer, int64_t r0, int64_t r1) override {
    const int64_t offset = Offset(layer, r0);
    const int64_t bytes = Bytes(r0, r1);
    used_.emplace_back(offset, bytes);
    Populate(offset, bytes);
    // Read-only: the kernel never writes to a block it is handed.
    return torch::from_blob(static_cast<char*>(base_) + offset, {r1 - r0, layout_.shape[2]},
                            torch::TensorOptions().dtype(Dtype()));
  }
  // Maps the block's pages in one call (MADV_POPULATE_READ, Linux 5.14)
  // instead of a fault per page as the kernel reads it; the views Rows()
  // still hands out (blocks ReadRows does not take) are re-read after every
  // Release(). On 32 x 10,000 x 1,024 it took the mapped centring from 8.3 to
  // 7.2 s, before ReadRows took that pass over. Older kernels answer EINVAL
  // and the pages fault in as before.
  void Populate(int64_t offset, int64_t bytes) {
#ifdef MADV_POPULATE_READ
    static const int64_t page = ::sysconf(_SC_PAGESIZE);
    if (!populate_) return;
    const int64_t begin = offset / page * page;
    if (::madvise(static_cast<char*>(base_) + begin,
                  static_cast<size_t>(offset + bytes - begin), MADV_POPULATE_READ) != 0 &&
        errno == EINVAL) {
      populate_ = false;
    }
#else
    (void)offset;
    (void)bytes;
#endif
  }

  // pread into the kernel's own buffer: one copy out of the page cache, and
  // no page-table work. Through the mapping every block is faulted in and
  // dropped again (Release) for each tile it is read for, which took 5 of
  // the 8 seconds of centring on 32 x 10,000 x 1,024 (bench/RESULTS.md).
  bool ReadRows(int64_t layer, int64_t r0, int64_t r1, torch::Tensor& dst) override {
    if (dst.scalar_type() != Dtype() || !dst.is_contiguous() ||
        dst.numel() != (r1 - r0) * layout_.shape[2]) {
      return false;
    }
    char* out = static_cast<char*>(dst.data_ptr());
    int64_t offset = Offset(layer, r0);
    int64_t left = Bytes(r0, r1);
    while (left > 0) {
      const ssize_t got = ::pread(fd_, out, static_cast<size_t>(left), offset);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return false;
      out += got;
      offset += got;
      left -= got;
    }
    return true;
  }

  void Release() override {
    static const int64_t page = ::sysconf(_SC_PAGESIZE);
    for (const auto& [offset, bytes] : used_) {
      // Only whole pages inside the range: a neighbour's page stays mapped.
      const int64_t begin = (offset + page - 1) / page * page;
      const int64_t end = (offset + bytes) / page * page;
      if (end > begin) {
        ::madvise(static_cast<char*>(base_) + begin,
                  static_cast<size_t>(end - begin), MADV_DONTNEED);
      }
    }
    used_.clear();
  }

 private:
  MappedStates(void* base, int64_t size, int fd, NpyLayout layout)
      : base_(base), size_(size), fd_(fd), layout_(std::move(layout)) {}
  // Where rows [r0, ...) of `layer` start in the file, and the bytes of rows
  // [r0, r1) of one layer; the element type they hold.
  int64_t Offset(int64_t layer, int64_t r0) const {
    return layout_.data_offset + (layer * num_rows() + r0) * layout_.shape[2] *
                                     layout_.dtype.item_size;
  }
  int64_t Bytes(int64_t r0, int64_t r1) const {
    return (r1 - r0) * layout_.shape[2] * layout_.dtype.item_size;
  }
  torch::ScalarType Dtype() const {
    return layout_.dtype.item_size == 8 ? torch::kFloat64 : torch::kFloat32;
  }
  void* base_;
  int64_t size_;
  int fd_;  // kept open for ReadRows
  NpyLayout layout_;
  std::vector<std::pair<int64_t, int64_t>> used_;
  bool populate_ = true;
};

// The advice printed when OpenBLAS runs its fallback kernels anyway
// (DEPTHBENCH_BLAS=default, or another program than depthbench-train).
std::string BlasAdvice(const std::string& core) {
  const std::string better = BetterOpenBlasCoreType(core);
  if (better.empty()) return "";
  return "OpenBLAS runs its generic Prescott kernels on a CPU that has better ones; "
         "OPENBLAS_CORETYPE=" + better + " makes sgemm several times faster";
}

// "deff: 12/55 ... (21.8%), 3.1 s elapsed, ETA 11.2 s" on the log, the first
// after `interval` seconds, then every `interval`.
class ProgressLine {
 public:
  ProgressLine(std::ostream* out, double interval)
      : out_(out), interval_(interval), start_(Clock::now()) {}
  void operator()(const CkaProgress& p) {
    if (out_ == nullptr) return;
    const Clock::time_point now = Clock::now();
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    if (elapsed < interval_) return;
    if (printed_ &&
        std::chrono::duration<double>(now - last_).count() < interval_) {
      return;
    }
    const double frac =
        p.total_flops > 0 ? std::min(1.0, p.done_flops / p.total_flops) : 1.0;
    const double eta = frac > 0 ? elapsed * (1.0 - frac) / frac : 0.0;
    *out_ << absl::StrFormat(
                 "deff: %d/%d GEMM steps (%.1f%% of %.0f GFLOP), %.1f s "
                 "elapsed, ETA %.1f s\n",
                 p.done_steps, p.total_steps, 100.0 * frac,
                 p.total_flops / 1e9, elapsed, eta)
          << std::flush;
    last_ = now;
    printed_ = true;
  }

 private:
  std::ostream* out_;
  double interval_;
  Clock::time_point start_, last_;
  bool printed_ = false;
};

// The (L, N, d) shape of a states file: layers first, within the layer
// limit, and its working buffers within options.max_working_bytes.
absl::Status CheckStatesShape(const std::string& path,
                              const std::vector<int64_t>& shape,
                              const DeffNpyOptions& options) {
  if (shape.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("deff: ", path, " must have shape (L, N, d), got ",
                     shape.size(), " dimensions"));
  }
  if (shape[0] < 1 || shape[1] < 2 || shape[2] < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("deff: need L >= 1, N >= 2, d >= 1; got (", shape[0],
                     ", ", shape[1], ", ", shape[2], ")"));
  }
  const std::string where =
      absl::StrCat("deff: ", path, " has shape ", NpyShapeString(shape));
  if (shape[0] > kDeffMaxLayers) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": L = ", shape[0], " layers is more than the ",
        kDeffMaxLayers, " supported (expected (L, N, d), layers first)"));
  }
  const int64_t need =
      PlanCkaUniform(shape[0], shape[1], shape[2], options.cka).working_bytes;
  if (need > options.max_working_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": D_eff on it needs about ", need >> 20,
                     " MiB, more than the limit of ",
                     options.max_working_bytes >> 20,
                     " MiB (use fewer sequences N or a smaller d)"));
  }
  return absl::OkStatus();
}

// The "perf" object of a run: form, time, GFLOP/s, RSS, and (with --perf or
// for a run over the progress interval) the sgemm peak measured now, also
// printed as the "deff: done in" line on options.log.
nlohmann::json PerfJson(const CkaResult& cka, const DeffNpyOptions& options) {
  const double gflop = cka.plan.flops / 1e9;
  nlohmann::json perf;
  perf["form"] = CkaFormName(cka.plan.form);
  perf["precision"] = CkaPrecisionName(cka.plan.precision);
  perf["diagonal_tiles"] = cka.diagonal_tiles;
  perf["gemm"] = cka.gemm;
  perf["seconds"] = cka.seconds;
  perf["phase_seconds"] = {{"means", cka.phases.means},
                           {"centre", cka.phases.centre},
                           {"gemm", cka.phases.gemm},
                           {"contract", cka.phases.contract}};
  perf["gflop"] = gflop;
  perf["gflops"] = cka.seconds > 0 ? gflop / cka.seconds : 0.0;
  perf["threads"] = at::get_num_threads();
  perf["tile_rows"] = cka.plan.tile_rows;
  const std::string blas_core = OpenBlasCoreName();
  perf["blas_core"] = blas_core;
  perf["block_layers"] = cka.plan.block_layers;
  perf["peak_rss_mib"] = static_cast<double>(PeakRssBytes()) / (1 << 20);
  const bool measured =
      options.perf || cka.seconds >= options.progress_interval_s;
  if (!measured) return perf;
  const SgemmPeak peak = MeasureSgemmPeak();
  perf["sgemm_peak_gflops"] = peak.gflops;
  perf["sgemm_peak_library"] = peak.library;
  perf["fraction_of_peak"] = perf["gflops"].get<double>() / peak.gflops;
  if (options.log == nullptr) return perf;
  *options.log << absl::StrFormat(
                      "deff: done in %.2f s: %.0f GFLOP (%s form, %s, GEMMs by %s%s), "
                      "%.1f GFLOP/s = %.0f%% of the sgemm peak %.1f GFLOP/s "
                      "(2048^3 %s, %d threads); peak RSS %.0f MiB\n",
                      cka.seconds, gflop, CkaFormName(cka.plan.form),
                      CkaPrecisionName(cka.plan.precision), cka.gemm,
                      cka.diagonal_tiles.empty()
                          ? ""
                          : ", diagonal tiles by " + cka.diagonal_tiles,
                      perf["gflops"].get<double>(),
                      100.0 * perf["fraction_of_peak"].get<double>(), peak.gflops,
                      peak.library, at::get_num_threads(),
                      perf["peak_rss_mib"].get<double>())
               << std::flush;
  const std::string advice = BlasAdvice(blas_core);
  if (!advice.empty()) *options.log << "deff: note: " << advice << "\n";
  return perf;
}

nlohmann::json DeffJson(const std::string& path,
                        const std::vector<int64_t>& shape,
                        const EffectiveDepthResult& r, nlohmann::json perf) {
  nlohmann::json out = EffectiveDepthJson(r);
  out["kind"] = "deff";
  out["states"] = path;
  out["layers"] = shape[0];
  out["sequences"] = shape[1];
  out["d_model"] = shape[2];
  out["perf"] = std::move(perf);
  return out;
}

}  // namespace

int64_t DeffWorkingBytes(int64_t num_layers, int64_t num_seq, int64_t dim) {
  return PlanCkaUniform(num_layers, num_seq, dim).working_bytes;
}

absl::StatusOr<nlohmann::json> DeffFromNpy(const std::string& path,
                                           int64_t max_lag,
                                           int64_t max_working_bytes) {
  DeffNpyOptions options;
  options.max_lag = max_lag;
  options.max_working_bytes = max_working_bytes;
  return DeffFromNpy(path, options);
}

absl::StatusOr<nlohmann::json> DeffFromNpy(const std::string& path,
                                           const DeffNpyOptions& options) {
  ASSIGN_OR_RETURN(NpyFileReader reader,
                   NpyFileReader::Open(path, StatesArray()));
  const NpyLayout layout = reader.layout();
  RETURN_IF_ERROR(CheckStatesShape(path, layout.shape, options));
  ASSIGN_OR_RETURN(std::unique_ptr<MappedStates> states,
                   MappedStates::Open(path, layout, reader.file_size()));
  const int64_t num_layers = layout.shape[0];
  if (options.max_lag < -1 || options.max_lag > num_layers - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("deff: --max-lag ", options.max_lag, " outside [0, ",
                     num_layers - 1, "] for L = ", num_layers));
  }
  CkaOptions cka_options = options.cka;
  ProgressLine line(options.log, options.progress_interval_s);
  auto user_progress = cka_options.progress;
  cka_options.progress = [&](const CkaProgress& p) {
    line(p);
    if (user_progress) user_progress(p);
  };
  ASSIGN_OR_RETURN(CkaResult cka,
                   LinearCkaMatrix(*states, cka_options,
                                   absl::StrCat("deff: ", path)));
  states.reset();
  nlohmann::json perf = PerfJson(cka, options);
  ASSIGN_OR_RETURN(EffectiveDepthResult r,
                   EffectiveDepthFromCka(std::move(cka.cka), options.max_lag));
  return DeffJson(path, layout.shape, r, std::move(perf));
}

absl::StatusOr<DeffNpyOptions> MakeDeffNpyOptions(const DeffCliFlags& flags,
                                                  int64_t max_lag,
                                                  std::ostream* log) {
  DeffNpyOptions options;
  options.max_lag = max_lag;
  ASSIGN_OR_RETURN(options.cka.precision,
                   ParseCkaPrecision(flags.precision, "--precision"));
  ASSIGN_OR_RETURN(options.cka.form, ParseCkaForm(flags.form, "--form"));
  if (flags.threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads: must be >= 0 (0 = all cores), got ",
                     flags.threads));
  }
  if (flags.budget_mib < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--budget-mib: must be >= 1, got ", flags.budget_mib));
  }
  options.cka.budget_bytes = flags.budget_mib << 20;
  options.perf = flags.perf;
  options.log = flags.quiet ? nullptr : log;
  SetKernelThreads(flags.threads);
  return options;
}

std::string FormatDeffTable(const nlohmann::json& d) {
  auto num = [&](const char* key, int precision) -> std::string {
    if (!d.contains(key) || !d[key].is_number()) return "n/a";
    return absl::StrFormat("%.*f", precision, d[key].get<double>());
  };
  auto integer = [&](const char* key) -> std::string {
    if (!d.contains(key) || !d[key].is_number_integer()) return "?";
    return absl::StrCat(d[key].get<int64_t>());
  };
  std::string s = absl::StrCat(
      "Effective depth of ", d.value("states", std::string("(states)")),
      "  (L=", integer("layers"), ", N=", integer("sequences"),
      ", d=", integer("d_model"), ", K=", integer("max_lag"), ")\n");
  absl::StrAppend(&s,
                  absl::StrFormat("  %-22s %12s\n", "D_eff", num("deff", 4)));
  absl::StrAppend(&s, absl::StrFormat("  %-22s %12s\n", "D_eff / L",
                                      num("deff_over_l", 4)));
  absl::StrAppend(
      &s, absl::StrFormat("  %-22s %12s\n", "rho_bar(1)", num("rho_bar1", 4)));
  absl::StrAppend(
      &s, absl::StrFormat("  %-22s %12s\n", "F_L = 2L/(L+1)", num("f_l", 4)));
  absl::StrAppend(&s, absl::StrFormat("  %-22s %12s\n", "gap to F_L (%)",
                                      num("gap_pct", 2)));
  if (d.contains("lag_profile") && d["lag_profile"].is_array()) {
    absl::StrAppend(&s, "  lag  rho_bar(k)\n");
    const auto& lag = d["lag_profile"];
    for (size_t k = 1; k < lag.size(); ++k) {
      absl::StrAppend(
          &s,
          absl::StrFormat("  %3d  %10s\n", static_cast<int>(k),
                          lag[k].is_number()
                              ? absl::StrFormat("%.4f", lag[k].get<double>())
                              : std::string("n/a")));
    }
  }
  return s;
}

}  // namespace diagnostics
}  // namespace depthbench
