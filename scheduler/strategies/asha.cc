#include "scheduler/strategies/asha.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace depthbench::scheduler::strategies {
namespace {

absl::Status Field(const std::string& field, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat("spec.strategy.", field, ": ", message));
}

}  // namespace

absl::StatusOr<StrategySettings> StrategyFromSpec(const depthbench::v1::StrategySpec& spec) {
  StrategySettings out;
  const std::string& kind = spec.kind();
  if (kind.empty() || kind == "grid") {
  } else if (kind == "successive_halving") {
    out.successive_halving = true;
  } else if (kind == "lr_transfer") {
    out.lr_transfer = true;
  } else if (kind == "successive_halving+lr_transfer" ||
             kind == "lr_transfer+successive_halving") {
    out.successive_halving = out.lr_transfer = true;
  } else {
    return Field("kind", absl::StrCat("unknown strategy \"", kind,
                                      "\" (valid: grid, successive_halving, lr_transfer, "
                                      "successive_halving+lr_transfer)"));
  }
  if (!out.successive_halving && (spec.rungs_size() > 0 || spec.reduction_factor() != 0)) {
    return Field(spec.rungs_size() > 0 ? "rungs" : "reduction_factor",
                 absl::StrCat("only applies to successive_halving, not to \"",
                              kind.empty() ? "grid" : kind, "\""));
  }
  if (!out.lr_transfer && !spec.reference_shape().empty()) {
    return Field("reference_shape", absl::StrCat("only applies to lr_transfer, not to \"",
                                                 kind.empty() ? "grid" : kind, "\""));
  }
  if (spec.rungs_size() > 0) {
    out.rungs.clear();
    double previous = 0;
    for (int i = 0; i < spec.rungs_size(); ++i) {
      const double r = spec.rungs(i);
      const std::string path = absl::StrCat("rungs[", i, "]");
      if (!std::isfinite(r) || r <= 0 || r > 1) {
        return Field(path, absl::StrCat("must be a fraction in (0, 1], got ", r));
      }
      if (r <= previous) {
        return Field(path, absl::StrCat("must be greater than the rung before it (", previous,
                                        "), got ", r));
      }
      previous = r;
      out.rungs.push_back(r);
    }
    if (out.rungs.back() != 1.0) out.rungs.push_back(1.0);
  }
  if (spec.reduction_factor() != 0) {
    const double eta = spec.reduction_factor();
    if (!std::isfinite(eta) || eta < 2 || eta > 1000) {
      return Field("reduction_factor", absl::StrCat("must be in [2, 1000] (0 = 3), got ", eta));
    }
    out.eta = eta;
  }
  if (!spec.reference_shape().empty()) {
    const std::string& ref = spec.reference_shape();
    const size_t x = ref.find('x');
    bool ok = x != std::string::npos && x > 0 && x + 1 < ref.size();
    for (size_t i = 0; ok && i < ref.size(); ++i) {
      ok = i == x || std::isdigit(static_cast<unsigned char>(ref[i]));
    }
    if (!ok) {
      return Field("reference_shape",
                   absl::StrCat("must be LAYERSxD_MODEL (e.g. \"4x64\"), got \"", ref, "\""));
    }
    out.reference_shape = ref;
  }
  return out;
}

std::string StrategyName(const StrategySettings& s) {
  if (s.successive_halving && s.lr_transfer) return "successive_halving+lr_transfer";
  if (s.successive_halving) return "successive_halving";
  if (s.lr_transfer) return "lr_transfer";
  return "grid";
}

int64_t RungEvalInterval(const std::vector<double>& rungs, int64_t total_steps,
                         int64_t eval_interval) {
  if (eval_interval > 0) return eval_interval;
  if (rungs.empty()) return 0;
  return std::max<int64_t>(1, std::llround(rungs.front() * static_cast<double>(total_steps)));
}

absl::StatusOr<std::vector<int64_t>> RungSteps(const std::vector<double>& rungs,
                                               int64_t total_steps, int64_t eval_interval) {
  const int64_t every = RungEvalInterval(rungs, total_steps, eval_interval);
  std::vector<int64_t> out;
  for (size_t i = 0; i + 1 < rungs.size(); ++i) {
    const double exact = rungs[i] * static_cast<double>(total_steps);
    const int64_t step =
        std::max<int64_t>(1, std::llround(exact / static_cast<double>(every))) * every;
    if (step >= total_steps || (!out.empty() && step <= out.back())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "spec.strategy.rungs[", i, "]: rung ", rungs[i], " of a ", total_steps,
          "-step run falls on step ", step, " (eval_interval ", every, "), ",
          step >= total_steps ? "the end of the run" : "the step of the rung before it",
          "; use fewer rungs or a smaller spec.training.eval_interval"));
    }
    out.push_back(step);
  }
  return out;
}

int64_t PromotionQuota(int64_t n, double eta, bool complete) {
  const int64_t q = static_cast<int64_t>(std::floor(static_cast<double>(n) / eta));
  return complete ? std::max<int64_t>(1, q) : q;
}

std::string RungDecision::Reason() const {
  if (verdict == Verdict::kWait) return "waiting for a rung";
  const std::string loss_text =
      std::isfinite(loss) ? absl::StrFormat("%.6g", loss) : std::string("not finite (diverged)");
  const char* what = verdict == Verdict::kPrune   ? "pruned"
                     : verdict == Verdict::kPause ? "paused"
                                                  : "promoted";
  return absl::StrCat(what, " at rung ", rung, " (step ", step, "): val_loss ", loss_text,
                      " ranks ", rank + 1, " of ", n, ", top ", quota, " continue");
}

namespace {

double Loss(double loss) {
  return std::isnan(loss) ? std::numeric_limits<double>::infinity() : loss;
}

bool Ahead(double loss_a, int64_t id_a, double loss_b, int64_t id_b) {
  return loss_a < loss_b || (loss_a == loss_b && id_a < id_b);
}

}  // namespace

RungDecision DecideAtStep(const std::vector<int64_t>& rung_steps, double eta,
                          const std::vector<RungEntry>& recorded, int64_t job_id, int64_t step,
                          double loss) {
  RungDecision out;
  const auto it = std::find(rung_steps.begin(), rung_steps.end(), step);
  if (it == rung_steps.end()) return out;
  const int rung = static_cast<int>(it - rung_steps.begin());
  loss = Loss(loss);
  int64_t better = 0, n = 1;
  for (const RungEntry& e : recorded) {
    if (e.rung != rung) continue;
    if (e.job_id == job_id) return out;  // decided before: never twice
    ++n;
    if (Ahead(Loss(e.loss), e.job_id, loss, job_id)) ++better;
  }
  out.job_id = job_id;
  out.rung = rung;
  out.step = step;
  out.loss = loss;
  out.rank = better;
  out.n = n;
  out.quota = PromotionQuota(n, eta, /*complete=*/false);
  if (!std::isfinite(loss)) {
    out.verdict = Verdict::kPrune;
  } else {
    out.verdict = better < out.quota ? Verdict::kPromote : Verdict::kPause;
  }
  return out;
}

std::vector<RungDecision> ResolveRungs(const std::vector<int64_t>& rung_steps, double eta,
                                       const std::vector<RungEntry>& recorded,
                                       const std::vector<int64_t>& open_jobs) {
  std::vector<RungDecision> out;
  for (size_t r = 0; r < rung_steps.size(); ++r) {
    std::vector<const RungEntry*> at;
    bool any_paused = false;
    for (const RungEntry& e : recorded) {
      if (e.rung != static_cast<int>(r)) continue;
      at.push_back(&e);
      any_paused = any_paused || e.decision == Verdict::kPause;
    }
    if (!any_paused) continue;
    std::set<int64_t> there;
    for (const RungEntry* e : at) there.insert(e->job_id);
    const bool complete = std::all_of(open_jobs.begin(), open_jobs.end(),
                                      [&](int64_t id) { return there.count(id) > 0; });
    std::sort(at.begin(), at.end(), [](const RungEntry* a, const RungEntry* b) {
      return Ahead(Loss(a->loss), a->job_id, Loss(b->loss), b->job_id);
    });
    const int64_t n = static_cast<int64_t>(at.size());
    const int64_t quota = PromotionQuota(n, eta, complete);
    for (int64_t rank = 0; rank < n; ++rank) {
      const RungEntry& e = *at[rank];
      if (e.decision != Verdict::kPause) continue;
      RungDecision d;
      d.job_id = e.job_id;
      d.rung = static_cast<int>(r);
      d.step = rung_steps[r];
      d.loss = Loss(e.loss);
      d.rank = rank;
      d.n = n;
      d.quota = quota;
      if (rank < quota && std::isfinite(d.loss)) {
        d.verdict = Verdict::kPromote;
      } else if (complete) {
        d.verdict = Verdict::kPrune;
      } else {
        continue;  // still waiting
      }
      out.push_back(d);
    }
  }
  return out;
}

std::vector<int> TransferSubGrid(int grid_size, int best_index) {
  std::vector<int> out;
  if (grid_size <= 0) return out;
  best_index = std::clamp(best_index, 0, grid_size - 1);
  const int width = std::min(3, grid_size);
  int lo = std::clamp(best_index - 1, 0, grid_size - width);
  for (int i = lo; i < lo + width; ++i) out.push_back(i);
  return out;
}

std::optional<int> WidenIndex(const std::vector<int>& active, int best_index, int grid_size) {
  if (active.empty()) return std::nullopt;
  const int lo = *std::min_element(active.begin(), active.end());
  const int hi = *std::max_element(active.begin(), active.end());
  if (best_index == lo && lo > 0) return lo - 1;
  if (best_index == hi && hi < grid_size - 1) return hi + 1;
  return std::nullopt;
}

}  // namespace depthbench::scheduler::strategies
