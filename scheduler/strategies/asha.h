// Strategies over the LR grid (issue 15): settings from the spec, the rung
// plan of a run, and the asynchronous successive-halving (ASHA) rung rule.
// No I/O: the scheduler records each decision durably (rung_results) and
// passes every recorded decision of the group back in, so a decision is
// made once and a restart neither loses nor repeats it.
//
// The rung rule (asynchronous successive halving with pausing, "ASHA" as
// in Li et al., "A System for Massively Parallel Hyperparameter Tuning",
// 2020). Rungs are steps of the full-length run (every run keeps the full
// LR schedule, so losses at one step are comparable). Runs are ranked at a
// rung by (loss, job id) ascending among the n runs of the group recorded
// there.
//  - Arrival: a run reaching a rung continues (promote) only if it ranks in
//    the top floor(n / eta) of the n runs there, itself included; otherwise
//    it is PAUSED: stopped (its checkpoint kept) and not leased, waiting.
//    So the first runs to arrive wait for company instead of going on.
//  - Later promotion: a paused run is promoted (re-queued; it resumes from
//    its checkpoint) as soon as later arrivals put it in the top
//    floor(n / eta) (n grows, and its rank among the runs does not change
//    the decisions already taken).
//  - Resolution: once every run of the group that has not ended has a
//    decision at the rung (all the others have reached it or ended), the
//    rung is complete: the paused runs in the top max(1, floor(n / eta))
//    are promoted and the other paused runs pruned (terminal).
// A run with a non-finite loss (NaN/inf) or whose trainer reported
// divergence is a loser: pruned at once, and counted at every rung it did
// not reach with loss +inf (so it ranks last, and raises n for the others).
// Ties in loss go to the lower job id. A promotion or prune is never taken
// back: a promoted run stays promoted even when better runs arrive later.
//
// Thread safety: pure functions.
#ifndef DEPTHBENCH_SCHEDULER_STRATEGIES_ASHA_H_
#define DEPTHBENCH_SCHEDULER_STRATEGIES_ASHA_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "depthbench/v1/spec.pb.h"

namespace depthbench::scheduler::strategies {

struct StrategySettings {
  bool successive_halving = false;
  bool lr_transfer = false;
  std::vector<double> rungs = {1.0 / 9, 1.0 / 3, 1.0};  // ends with 1
  double eta = 3;
  std::string reference_shape;  // "LxD"; empty = the first shape
  bool grid() const { return !successive_halving && !lr_transfer; }
};

// Validated settings with defaults; InvalidArgument names the field as
// `spec.strategy.<field>: ...`.
absl::StatusOr<StrategySettings> StrategyFromSpec(const depthbench::v1::StrategySpec& spec);

// The kind's canonical name ("grid", "successive_halving", "lr_transfer",
// "successive_halving+lr_transfer").
std::string StrategyName(const StrategySettings& settings);

// The decision steps of a run of `total_steps` optimizer steps that
// evaluates validation every `eval_interval` steps (0: at the end only):
// every rung but the last (the run's end), each rounded to the nearest
// multiple of the interval (at least one interval). InvalidArgument when two
// rungs land on the same step or a rung lands on the end; the message names
// spec.strategy.rungs and suggests a smaller eval_interval.
absl::StatusOr<std::vector<int64_t>> RungSteps(const std::vector<double>& rungs,
                                               int64_t total_steps, int64_t eval_interval);

// The eval_interval a successive-halving job should run with, so that it
// evaluates at every rung: the configured one, or (0 = end only) the first
// rung's unrounded step, at least 1.
int64_t RungEvalInterval(const std::vector<double>& rungs, int64_t total_steps,
                         int64_t eval_interval);

// One recorded decision of a group's run at a rung.
enum class Verdict { kWait, kPromote, kPause, kPrune };

struct RungEntry {
  int64_t job_id = 0;
  int rung = 0;
  double loss = 0;  // +inf for a diverged run
  Verdict decision = Verdict::kPromote;  // kPromote, kPause or kPrune
};

struct RungDecision {
  Verdict verdict = Verdict::kWait;
  int rung = -1;      // which rung was decided (kPromote / kPrune)
  int64_t step = 0;   // its step
  double loss = 0;
  int64_t rank = 0;   // 0-based among the n runs at the rung
  int64_t n = 0;
  int64_t quota = 0;
  int64_t job_id = 0;  // ResolveRungs: whose decision it is
  // "pruned at rung 1 (step 30): val_loss 4.2 ranks 3 of 4, top 1 continue"
  std::string Reason() const;
};

// max(1, floor(n / eta)) when the rung is `complete`, else floor(n / eta)
// (which is 0 while n < eta: early arrivals wait).
int64_t PromotionQuota(int64_t n, double eta, bool complete = true);

// What run `job_id`'s validation loss `loss` at `step` decides on arrival,
// given the group's recorded decisions `recorded` (any order, any rung):
// kWait when `step` is no rung step or the run already has a decision at
// that rung (never decided twice); else promote (top floor(n / eta)), prune
// (non-finite loss) or pause. The caller records it, then calls
// ResolveRungs, which may promote or prune it (and others) at once.
RungDecision DecideAtStep(const std::vector<int64_t>& rung_steps, double eta,
                          const std::vector<RungEntry>& recorded, int64_t job_id,
                          int64_t step, double loss);

// The changes the recorded decisions call for now: every paused run that
// ranks in the top floor(n / eta) of its rung is promoted; at a complete
// rung (every job in `open_jobs`, the group's runs that have not ended,
// has a decision there) the paused runs in the top max(1, floor(n / eta))
// are promoted and the rest pruned. Each change is kPromote or kPrune with
// its job_id, rung, rank, n and quota. Applying them and calling again
// yields more only when a prune ended a run that held a later rung open
// (the caller repeats until none). Empty when nothing is paused.
std::vector<RungDecision> ResolveRungs(const std::vector<int64_t>& rung_steps, double eta,
                                       const std::vector<RungEntry>& recorded,
                                       const std::vector<int64_t>& open_jobs);

// LR transfer. The LRs (indices into the ascending grid of `grid_size`) a
// non-reference shape starts with, given the reference group's best LR
// index: the best and its two neighbours, shifted inwards at an edge of the
// grid (min(3, grid_size) LRs).
std::vector<int> TransferSubGrid(int grid_size, int best_index);

// The LR index to add to a group's sub-grid `active` (ascending indices)
// whose best is `best_index`: the neighbour beyond the best when the best is
// the lowest or highest LR of the sub-grid and that is not the grid's own
// edge; nullopt when the group is decided.
std::optional<int> WidenIndex(const std::vector<int>& active, int best_index, int grid_size);

}  // namespace depthbench::scheduler::strategies

#endif  // DEPTHBENCH_SCHEDULER_STRATEGIES_ASHA_H_
