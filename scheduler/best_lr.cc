#include "scheduler/best_lr.h"

#include <map>

#include <nlohmann/json.hpp>

namespace depthbench::scheduler {

bool IsTerminalState(const std::string& state) {
  return state == "succeeded" || state == "diverged" || state == "failed" ||
         state == "cancelled";
}

GroupSelection SelectBest(const std::vector<storage::GroupMember>& jobs) {
  GroupSelection out;
  out.complete = !jobs.empty();
  std::map<double, LrSummary> by_lr;
  std::map<double, double> sums;
  std::map<double, std::pair<double, int64_t>> best_run;  // lr -> (loss, job)
  for (const storage::GroupMember& job : jobs) {
    LrSummary& s = by_lr[job.lr];
    s.lr = job.lr;
    if (!IsTerminalState(job.state)) out.complete = false;
    if (job.state == "succeeded" && job.val_loss.has_value()) {
      ++s.succeeded;
      sums[job.lr] += *job.val_loss;
      auto it = best_run.find(job.lr);
      if (it == best_run.end() || *job.val_loss < it->second.first) {
        best_run[job.lr] = {*job.val_loss, job.id};
      }
    } else if (job.state == "diverged") {
      ++s.diverged;
    } else if (job.state == "failed" || job.state == "cancelled" ||
               job.state == "succeeded") {
      ++s.failed;  // includes a success that reported no validation loss
    }
  }
  for (auto& [lr, s] : by_lr) {
    if (s.succeeded > 0) s.mean_val_loss = sums[lr] / s.succeeded;
    out.lrs.push_back(s);
    if (s.mean_val_loss.has_value() && s.diverged == 0 &&
        (!out.best_val_loss.has_value() || *s.mean_val_loss < *out.best_val_loss)) {
      out.best_val_loss = s.mean_val_loss;
      out.best_lr = lr;
      out.best_job_id = best_run[lr].second;
    }
  }
  return out;
}

int64_t DiagnosisTarget(const GroupSelection& selection,
                        const std::vector<storage::GroupMember>& jobs, double fixed_lr) {
  if (!selection.complete) return 0;
  if (fixed_lr <= 0) return selection.best_job_id;
  int64_t target = 0;
  double best = 0;
  for (const storage::GroupMember& job : jobs) {
    if (job.lr != fixed_lr || job.state != "succeeded" || !job.val_loss.has_value()) continue;
    if (target == 0 || *job.val_loss < best) {
      target = job.id;
      best = *job.val_loss;
    }
  }
  return target;
}

std::string LrsToJson(const std::vector<LrSummary>& lrs) {
  nlohmann::json arr = nlohmann::json::array();
  for (const LrSummary& s : lrs) {
    nlohmann::json j;
    j["lr"] = s.lr;
    j["val_loss"] = s.mean_val_loss.has_value() ? nlohmann::json(*s.mean_val_loss)
                                                : nlohmann::json(nullptr);
    j["diverged"] = s.diverged > 0;
    j["succeeded"] = s.succeeded;
    j["diverged_runs"] = s.diverged;
    j["failed_runs"] = s.failed;
    arr.push_back(j);
  }
  return arr.dump();
}

}  // namespace depthbench::scheduler
