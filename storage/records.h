// Plain rows of the scheduler's tables, as the stores read and write them.
// Job states and kinds are the proto enums; the stores convert them to and
// from the text stored in SQLite through storage/job_text.h, and nowhere
// else.
//
// Thread safety: plain values.
#ifndef DEPTHBENCH_STORAGE_RECORDS_H_
#define DEPTHBENCH_STORAGE_RECORDS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "depthbench/v1/types.pb.h"

namespace depthbench::storage {

struct SweepRecord {
  int64_t id = 0;
  std::string name;
  std::string spec;  // serialised depthbench.v1.SweepSpec
  int64_t created_ms = 0;
  bool cancelled = false;
};

struct JobRecord {
  int64_t id = 0;
  int64_t sweep_id = 0;
  depthbench::v1::JobKind kind = depthbench::v1::TRAIN;
  depthbench::v1::JobState state = depthbench::v1::PENDING;
  std::string arch;
  int64_t layers = 0;
  int64_t d_model = 0;
  double lr = 0;
  int64_t seed = 0;
  std::string config_json;
  int64_t attempts_used = 0;
  int64_t max_attempts = 1;
  int64_t current_attempt_id = 0;
  std::string worker_id;
  int64_t not_before_ms = 0;  // wall clock; backoff
  std::optional<double> val_loss;
  int64_t final_step = 0;
  std::string reason;
  std::string checkpoint_dir;
  bool is_best = false;
  int64_t parent_job_id = 0;
  int64_t req_devices = 0;
  int64_t req_memory_mb = 0;
  std::string req_labels = "{}";  // JSON object of label -> value
  int64_t created_ms = 0;
  int64_t updated_ms = 0;
};

// The columns of a train job that best-LR selection reads (one row of
// JobStore::ListGroup); cheaper than a JobRecord, which carries the config.
struct GroupMember {
  int64_t id = 0;
  depthbench::v1::JobState state = depthbench::v1::JOB_STATE_UNSPECIFIED;
  double lr = 0;
  std::optional<double> val_loss;
  bool is_best = false;
  int64_t final_step = 0;
};

struct AttemptRecord {
  int64_t id = 0;
  int64_t job_id = 0;
  int64_t number = 0;
  std::string worker_id;
  int64_t start_ms = 0;
  int64_t end_ms = 0;
  std::string outcome = "running";
  std::string reason;
  // The step the attempt's trainer resumed from (0: from scratch); unset
  // until the attempt's first report carries it (schema v5).
  std::optional<int64_t> resumed_from_step;
};

struct WorkerRecord {
  std::string id;
  int64_t devices = 0;
  int64_t memory_mb = 0;
  int64_t slots = 1;
  std::string labels_json = "{}";
  int64_t registered_ms = 0;
  int64_t last_seen_ms = 0;
};

struct MetricRecord {
  int64_t row_id = 0;  // insertion order; WatchJob's cursor
  int64_t job_id = 0;
  int64_t attempt_id = 0;
  int64_t step = 0;
  std::string name;
  double value = 0;
  int64_t wall_ms = 0;
  // 0: in the job's canonical history; else the later attempt whose resume
  // abandoned this point (schema v5).
  int64_t superseded_by = 0;
};

// One learning rate of a result row: how its runs ended (results.lrs_json
// holds these as a JSON array; the store parses it once, on read).
struct LrSummary {
  double lr = 0;
  std::optional<double> mean_val_loss;  // over the succeeded runs
  int succeeded = 0;
  int diverged = 0;
  int failed = 0;  // failed or cancelled
};

struct ResultRecord {
  int64_t sweep_id = 0;
  std::string arch;
  int64_t layers = 0;
  int64_t d_model = 0;
  double aspect_ratio = 0;
  int64_t params = 0;
  std::optional<double> best_lr;
  std::optional<double> best_val_loss;
  int64_t best_job_id = 0;
  std::vector<LrSummary> lrs;  // ascending LR; stored as lrs_json
  bool complete = false;
  std::string diagnostics_json = "{}";
};

// One learning rate of one (arch, shape) group: how its train jobs stand
// (table result_lrs, schema v5). A job counts in `ended` once terminal and
// then in exactly one of succeeded (with a validation loss), diverged or
// failed (failed, cancelled, or succeeded without a loss); loss_sum and the
// best run are over the succeeded ones.
struct LrTally {
  int64_t sweep_id = 0;
  std::string arch;
  int64_t layers = 0;
  int64_t d_model = 0;
  double lr = 0;
  int64_t jobs = 0;
  int64_t ended = 0;
  int64_t succeeded = 0;
  int64_t diverged = 0;
  int64_t failed = 0;
  double loss_sum = 0;
  int64_t best_job_id = 0;  // 0: none yet
  std::optional<double> best_val_loss;
};

// The columns of a train job QueryResults lists per run.
struct RunRecord {
  int64_t id = 0;
  std::string arch;
  int64_t layers = 0;
  int64_t d_model = 0;
  double lr = 0;
  int64_t seed = 0;
  depthbench::v1::JobState state = depthbench::v1::JOB_STATE_UNSPECIFIED;
  std::optional<double> val_loss;
  int64_t final_step = 0;
  bool is_best = false;
};

// One successive-halving decision of a train run at a rung (table
// rung_results, schema v7).
struct RungRecord {
  int64_t job_id = 0;
  int rung = 0;
  int64_t step = 0;
  std::optional<double> val_loss;  // unset: diverged
  std::string decision;            // "promote" | "prune"
  int64_t decided_ms = 0;
};

struct DiagnosticRecord {
  int64_t job_id = 0;
  std::string kind;
  std::string data_json;
  int64_t created_ms = 0;
};

}  // namespace depthbench::storage

#endif  // DEPTHBENCH_STORAGE_RECORDS_H_
