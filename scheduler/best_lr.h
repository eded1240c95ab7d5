// Best-LR selection for one (arch, shape) group (spec section 6): per LR the
// mean final validation loss over the seeds that succeeded; an LR where any
// seed diverged is marked diverged and not eligible; the best LR is the
// eligible one with the lowest mean loss, and the best run is that LR's
// succeeded job with the lowest loss.
//
// The rule works on per-LR tallies (storage::LrTally), which the scheduler
// keeps up to date as each run ends (O(1) per run); SelectBest over a
// group's jobs builds the same tallies first, so both paths share it.
//
// Thread safety: pure functions.
#ifndef DEPTHBENCH_SCHEDULER_BEST_LR_H_
#define DEPTHBENCH_SCHEDULER_BEST_LR_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "storage/records.h"

namespace depthbench::scheduler {

using storage::LrSummary;

struct GroupSelection {
  std::vector<LrSummary> lrs;  // ascending LR
  bool complete = false;       // every job is in a terminal state
  std::optional<double> best_lr;
  std::optional<double> best_val_loss;
  int64_t best_job_id = 0;     // 0 when none
};

bool IsTerminalState(depthbench::v1::JobState state);

GroupSelection SelectBest(const std::vector<storage::GroupMember>& jobs);

// The selection from a group's tallies, ascending LR. `complete` when the
// group has jobs and every one has ended.
GroupSelection SelectBestFromTallies(const std::vector<storage::LrTally>& lrs);

// What one train job in `state` (with `val_loss`, id `job_id`) adds to its
// LR's tally: nothing while it has not ended; ended plus one of
// succeeded/diverged/failed after; a succeeded job with a loss also adds
// the loss and offers itself as the LR's best run. Only the count fields,
// loss_sum, best_job_id and best_val_loss are set.
storage::LrTally TallyOf(depthbench::v1::JobState state, std::optional<double> val_loss,
                         int64_t job_id);

// Adds `add`'s counts and loss to `into` and takes its best run when its
// loss is lower (callers add jobs by id, so ties keep the lowest id).
void Accumulate(storage::LrTally* into, const storage::LrTally& add);

// The run a group's diagnose job examines, 0 while there is none. Nothing
// before the group is complete (spec section 6: once every LR has ended).
// fixed_lr == 0: the best run (selection.best_job_id). fixed_lr > 0 (spec
// section 9, the paper's Figures 5-6 at 2e-3): the succeeded run at exactly
// that LR with the lowest validation loss over its seeds, whether or not it
// is the best LR; 0 when every run at that LR diverged or failed (such an LR
// has no checkpoint worth diagnosing).
int64_t DiagnosisTarget(const GroupSelection& selection,
                        const std::vector<storage::GroupMember>& jobs, double fixed_lr);
// The same from the group's LR tallies (each LR's best_job_id is its
// succeeded run with the lowest loss, ties to the lowest id).
int64_t DiagnosisTargetFromTallies(const GroupSelection& selection,
                                   const std::vector<storage::LrTally>& lrs, double fixed_lr);

}  // namespace depthbench::scheduler

#endif  // DEPTHBENCH_SCHEDULER_BEST_LR_H_
