#include "scheduler/best_lr.h"

#include <map>

namespace depthbench::scheduler {

namespace v1 = ::depthbench::v1;

bool IsTerminalState(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::DIVERGED || state == v1::FAILED ||
         state == v1::CANCELLED || state == v1::PRUNED || state == v1::SKIPPED;
}

storage::LrTally TallyOf(v1::JobState state, std::optional<double> val_loss,
                         int64_t job_id) {
  storage::LrTally t;
  if (!IsTerminalState(state)) return t;
  t.ended = 1;
  // Strategies (issue 15): a pruned or never-run (skipped) job has ended,
  // is no failure, and offers no final loss.
  if (state == v1::PRUNED || state == v1::SKIPPED) return t;
  if (state == v1::SUCCEEDED && val_loss.has_value()) {
    t.succeeded = 1;
    t.loss_sum = *val_loss;
    t.best_job_id = job_id;
    t.best_val_loss = val_loss;
  } else if (state == v1::DIVERGED) {
    t.diverged = 1;
  } else {
    t.failed = 1;  // failed, cancelled, or a success that reported no loss
  }
  return t;
}

void Accumulate(storage::LrTally* into, const storage::LrTally& add) {
  into->ended += add.ended;
  into->succeeded += add.succeeded;
  into->diverged += add.diverged;
  into->failed += add.failed;
  into->loss_sum += add.loss_sum;
  if (add.best_job_id != 0 &&
      (!into->best_val_loss.has_value() || *add.best_val_loss < *into->best_val_loss)) {
    into->best_job_id = add.best_job_id;
    into->best_val_loss = add.best_val_loss;
  }
}

GroupSelection SelectBest(const std::vector<storage::GroupMember>& jobs) {
  std::map<double, storage::LrTally> by_lr;
  for (const storage::GroupMember& job : jobs) {  // by id: ties go to the lowest
    storage::LrTally& t = by_lr[job.lr];
    t.lr = job.lr;
    ++t.jobs;
    Accumulate(&t, TallyOf(job.state, job.val_loss, job.id));
  }
  std::vector<storage::LrTally> tallies;
  for (auto& [lr, t] : by_lr) tallies.push_back(std::move(t));
  return SelectBestFromTallies(tallies);
}

GroupSelection SelectBestFromTallies(const std::vector<storage::LrTally>& lrs) {
  GroupSelection out;
  int64_t jobs = 0, ended = 0;
  for (const storage::LrTally& t : lrs) {
    jobs += t.jobs;
    ended += t.ended;
    LrSummary s;
    s.lr = t.lr;
    s.succeeded = static_cast<int>(t.succeeded);
    s.diverged = static_cast<int>(t.diverged);
    s.failed = static_cast<int>(t.failed);
    if (t.succeeded > 0) s.mean_val_loss = t.loss_sum / static_cast<double>(t.succeeded);
    out.lrs.push_back(s);
    if (s.mean_val_loss.has_value() && s.diverged == 0 &&
        (!out.best_val_loss.has_value() || *s.mean_val_loss < *out.best_val_loss)) {
      out.best_val_loss = s.mean_val_loss;
      out.best_lr = t.lr;
      out.best_job_id = t.best_job_id;
    }
  }
  out.complete = jobs > 0 && ended == jobs;
  return out;
}

int64_t DiagnosisTarget(const GroupSelection& selection,
                        const std::vector<storage::GroupMember>& jobs, double fixed_lr) {
  if (!selection.complete) return 0;
  if (fixed_lr <= 0) return selection.best_job_id;
  int64_t target = 0;
  double best = 0;
  for (const storage::GroupMember& job : jobs) {
    if (job.lr != fixed_lr || job.state != v1::SUCCEEDED || !job.val_loss.has_value()) continue;
    if (target == 0 || *job.val_loss < best) {
      target = job.id;
      best = *job.val_loss;
    }
  }
  return target;
}

int64_t DiagnosisTargetFromTallies(const GroupSelection& selection,
                                   const std::vector<storage::LrTally>& lrs, double fixed_lr) {
  if (!selection.complete) return 0;
  if (fixed_lr <= 0) return selection.best_job_id;
  for (const storage::LrTally& t : lrs) {
    if (t.lr == fixed_lr) return t.best_job_id;
  }
  return 0;
}

}  // namespace depthbench::scheduler
