// Strategies over the LR grid (issue 15): settings from the spec, the rung
// plan of a run, and the asynchronous successive-halving (ASHA) rung rule.
// No I/O: the scheduler records each decision durably (rung_results) and
// passes every recorded decision of the group back in, so a decision is
// made once and a restart neither loses nor repeats it.
//
// The rung rule. Rungs are steps of the full-length run (every run keeps the
// full LR schedule, so losses at one step are comparable). When a run's
// validation loss at a rung arrives, let n be the number of the group's runs
// with a decision at that rung, this run included. The run continues
// (promote) when its rank among them, by (loss, job id) ascending, is below
// quota(n) = max(1, floor(n / eta)); otherwise it is stopped (prune).
// Small counts: the first run to reach a rung is the top 1 of 1 and always
// continues; so does any later run that beats every earlier one while
// n < 2 * eta. A run with a non-finite loss (NaN/inf) or whose trainer
// reported divergence is a loser: it is pruned at once, and counted at
// every rung it did not reach with loss +inf (so it ranks last, and raises n
// for the others). Ties in loss go to the lower job id. A decision is never
// taken back: a promoted run stays promoted even when better runs arrive
// later (asynchronous halving, as in Li et al., "A System for Massively
// Parallel Hyperparameter Tuning", 2020).
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
struct RungEntry {
  int64_t job_id = 0;
  int rung = 0;
  double loss = 0;  // +inf for a diverged run
};

enum class Verdict { kWait, kPromote, kPrune };

struct RungDecision {
  Verdict verdict = Verdict::kWait;
  int rung = -1;      // which rung was decided (kPromote / kPrune)
  int64_t step = 0;   // its step
  double loss = 0;
  int64_t rank = 0;   // 0-based among the n runs at the rung
  int64_t n = 0;
  int64_t quota = 0;
  // "pruned at rung 1 (step 30): val_loss 4.2 ranks 3 of 4, top 1 continue"
  std::string Reason() const;
};

// max(1, floor(n / eta)).
int64_t PromotionQuota(int64_t n, double eta);

// What run `job_id`'s validation loss `loss` at `step` decides, given the
// group's recorded decisions `recorded` (any order, any rung): kWait when
// `step` is no rung step or the run already has a decision at that rung
// (never decided twice); else promote or prune by the rung rule.
RungDecision DecideAtStep(const std::vector<int64_t>& rung_steps, double eta,
                          const std::vector<RungEntry>& recorded, int64_t job_id,
                          int64_t step, double loss);

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
