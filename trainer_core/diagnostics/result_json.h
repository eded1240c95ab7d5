// JSON for diagnostics results, shared by the in-model diagnose job
// (run.cc) and `diagnose deff --states` (deff_npy.cc): non-finite numbers
// become null, and D_eff's summary fields are written in one place.
#ifndef DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_RESULT_JSON_H_
#define DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_RESULT_JSON_H_

#include <cmath>
#include <vector>

#include <nlohmann/json.hpp>

#include "trainer_core/diagnostics/metrics.h"

namespace depthbench::diagnostics {

// A finite number as itself; NaN and +-inf as null (JSON has neither).
inline nlohmann::json Num(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

inline nlohmann::json VectorJson(const std::vector<double>& v) {
  nlohmann::json out = nlohmann::json::array();
  for (double x : v) out.push_back(Num(x));
  return out;
}

inline nlohmann::json MatrixJson(const Matrix& m) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : m) rows.push_back(VectorJson(r));
  return rows;
}

// D_eff's result (spec section 7): max_lag, deff, deff_over_l, rho_bar1,
// f_l, gap_pct, lag_profile and the CKA matrix. Callers add where the
// states came from (layers, sequences, file).
inline nlohmann::json EffectiveDepthJson(const EffectiveDepthResult& r) {
  nlohmann::json out;
  out["max_lag"] = r.max_lag;
  out["deff"] = Num(r.deff);
  out["deff_over_l"] = Num(r.deff_over_l);
  out["rho_bar1"] = Num(r.rho_bar1);
  out["f_l"] = Num(r.f_l);
  out["gap_pct"] = Num(r.gap_pct);
  out["lag_profile"] = VectorJson(r.lag_profile);
  out["cka"] = MatrixJson(r.cka);
  return out;
}

}  // namespace depthbench::diagnostics

#endif  // DEPTHBENCH_TRAINER_CORE_DIAGNOSTICS_RESULT_JSON_H_
