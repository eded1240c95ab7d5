#include "trainer_core/diagnostics/deff_npy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "trainer_core/diagnostics/metrics.h"
#include "trainer_core/diagnostics/npy.h"
#include "trainer_core/npy.h"

namespace depthbench {
namespace diagnostics {
namespace {

nlohmann::json Num(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

nlohmann::json MatrixJson(const Matrix& m) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : m) {
    nlohmann::json row = nlohmann::json::array();
    for (double v : r) row.push_back(Num(v));
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace

int64_t DeffWorkingBytes(int64_t num_layers, int64_t num_seq, int64_t dim) {
  // In long double so that products of int64 sizes cannot overflow.
  const long double l = num_layers, n = num_seq, d = dim;
  const long double m = std::min(n, d);
  const long double bytes = 4.0L * l * n * d     // the float32 array
                            + 16.0L * l * n * d  // float64 pooled + centred
                            + 8.0L * l * m * m   // Gram matrices (N <= d)
                            + 8.0L * m * m       // one transient product
                            + 8.0L * l * l;      // the CKA matrix
  constexpr auto kMax = std::numeric_limits<int64_t>::max();
  return bytes >= static_cast<long double>(kMax) ? kMax
                                                 : static_cast<int64_t>(bytes);
}

absl::StatusOr<nlohmann::json> DeffFromNpy(const std::string& path,
                                           int64_t max_lag,
                                           int64_t max_working_bytes) {
  auto check_shape = [&](const std::vector<int64_t>& shape) -> absl::Status {
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
    const int64_t need = DeffWorkingBytes(shape[0], shape[1], shape[2]);
    if (need > max_working_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": D_eff on it needs about ", need >> 20,
                       " MiB, more than the limit of ", max_working_bytes >> 20,
                       " MiB (use fewer sequences N or a smaller d)"));
    }
    return absl::OkStatus();
  };
  ASSIGN_OR_RETURN(NpyArray arr, ReadNpyFloat32(path, check_shape));
  const int64_t num_layers = arr.shape[0];
  const int64_t num_seq = arr.shape[1];
  const int64_t dim = arr.shape[2];
  torch::Tensor pooled =
      torch::from_blob(arr.data.data(), {num_layers, num_seq, dim},
                       torch::TensorOptions().dtype(torch::kFloat32));
  ASSIGN_OR_RETURN(EffectiveDepthResult r,
                   EffectiveDepthFromPooled(pooled, max_lag));
  nlohmann::json out;
  out["kind"] = "deff";
  out["states"] = path;
  out["layers"] = num_layers;
  out["sequences"] = num_seq;
  out["d_model"] = dim;
  out["max_lag"] = r.max_lag;
  out["deff"] = Num(r.deff);
  out["deff_over_l"] = Num(r.deff_over_l);
  out["rho_bar1"] = Num(r.rho_bar1);
  out["f_l"] = Num(r.f_l);
  out["gap_pct"] = Num(r.gap_pct);
  nlohmann::json lag = nlohmann::json::array();
  for (double v : r.lag_profile) lag.push_back(Num(v));
  out["lag_profile"] = std::move(lag);
  out["cka"] = MatrixJson(r.cka);
  return out;
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
