// Runs one leased attempt as a `depthbench-train` child and reports its end.
//
//   <root>/<checkpoint_dir>/attempt-<id>.config.json  the job config, with
//                                                      `threads` set per slot
//   <root>/<checkpoint_dir>/attempt-<id>.stderr.log    the child's stderr
//   depthbench-train train --config ... --out <root>/<checkpoint_dir> --resume
//
// `--resume` is always passed: the trainer continues from checkpoint.pt when
// a previous attempt (on any worker sharing the root) left one, and starts
// fresh otherwise. Stdout events are parsed (worker/trainer_events.h),
// relayed (worker/metric_relay.h) and mirrored into the worker's Prometheus
// gauges (live, every event); the last kStderrTailLines stderr lines are
// kept for the report.
//
// Publication is live (issue 19): every step/eval/checkpoint point goes to
// the relay as soon as its line is read, and the relay delivers it within
// about flush_ms. The trainer's `start` event says which step it resumed
// from; the relay's first report carries that step (resumed_from_step), and
// the scheduler moves earlier attempts' points after it out of the job's
// canonical history (they stay stored under their attempt). So a step that
// a killed attempt logged after its last checkpoint, and the retry re-ran,
// counts once: the retry's. An empty report at `start` marks the job running
// at once. Checkpoint events also give a `checkpoint_seconds` point and an
// observation of the worker's checkpoint-duration histogram.
//
// What an attempt logged up to the checkpoint a retry resumes from must also
// reach the scheduler when the attempt died before its relay delivered it
// (worker kill -9, scheduler outage followed by lease expiry): every stdout
// line is logged to <run>/attempt-<id>.events.jsonl, and <run>/published_step
// records the step through which the scheduler acknowledged every point of
// the job's current trajectory (written after each acknowledged batch; the
// run dir is shared by all workers). A resumed attempt (trainer `start` with
// resumed_from_step C) first lowers the marker to C (steps after C belong to
// an abandoned trajectory), then replays the points of steps (marker, C]
// from the earlier attempts' logs under its own attempt id; the scheduler
// stores a replayed point only where the canonical history lacks that (step,
// name), so a marker that lags (a crash between an acknowledgement and its
// write) costs a re-send, never a duplicate.
//
// End -> FinishJob:
//   exit 0 with a `done` event  SUCCEEDED (val loss, final step, checkpoint)
//   exit 3                      DIVERGED (the trainer's reason)
//   Interrupt()                 INTERRUPTED (re-queued, attempt not counted)
//   anything else               FAILED: "<exit code N | killed by signal S>"
//                               plus the stderr tail; this includes exit 4
//                               ("interrupted") that the worker did not ask
//                               for, which must use an attempt and back off
//                               rather than re-queue at once for ever
//   Cancel() / stale lease      nothing: the scheduler already ended the
//                               attempt and would refuse the report
// FinishJob is retried through scheduler outages (the attempt stays in the
// worker's heartbeats meanwhile, which keeps its lease alive). Every report
// is bounded and valid: text from the child is sanitized to UTF-8 and cut
// (worker/output_limits.h), points that would push it past
// kMaxReportBytes go ahead over ReportMetrics, and a report the scheduler
// refuses for good (RESOURCE_EXHAUSTED, INVALID_ARGUMENT, OUT_OF_RANGE,
// INTERNAL three times) is replaced once by a minimal one (status, final
// step, val loss, a short reason) that always fits; a refused minimal
// report ends the attempt unreported (the lease then expires).
//
// Supervision ends with the trainer, not with its pipes: once the child
// exited, its whole tree is killed (ChildProcess::KillTree) and the pipes
// are drained for at most `drain_ms`, so a descendant holding stdout open
// cannot keep the job leased or the worker's shutdown waiting.
//
// Output bounds: lines are split without buffering more than
// `max_stdout_line_bytes` (stderr: kMaxStderrLineBytes; a longer line is
// cut, and a cut stdout line is dropped), the stderr log and the events
// log (valid events only) stop at `attempt_log_max_bytes` each, and the
// worker's own log gets a rate-limited warning for stdout lines that are
// not events plus one summary at the end.
//
// Stopping: Cancel() and Interrupt() send SIGTERM to the child's process
// group (the trainer checkpoints and exits 4) and SIGKILL to its tree once
// `grace_ms` passed.
//
// Thread safety: Start() once; Cancel(), Interrupt(), done() and the
// accessors are thread-safe. The runner's thread sets done() and then calls
// `on_done` as its last act; `on_done` must not destroy the runner (it may
// signal the owner, whose destructor call joins the thread).
// Ownership: borrows the client, the clock and the metrics bundle
// (nullable), which must outlive the runner.
#ifndef DEPTHBENCH_WORKER_JOB_RUNNER_H_
#define DEPTHBENCH_WORKER_JOB_RUNNER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/daemon_metrics.h"
#include "depthbench/v1/worker_service.pb.h"
#include "common/child_process.h"
#include "worker/metric_relay.h"
#include "worker/output_limits.h"
#include "worker/scheduler_client.h"

namespace depthbench::worker {

inline constexpr int kStderrTailLines = 20;
inline constexpr size_t kMaxStderrLineBytes = 4096;
// Each stderr tail line in a FAILED reason.
inline constexpr size_t kMaxTailLineBytes = 400;
inline constexpr size_t kMaxReasonBytes = 8192;
// Below gRPC's default 4 MiB receive limit of the scheduler.
inline constexpr size_t kMaxReportBytes = 3 * 1024 * 1024 + 512 * 1024;

struct JobRunnerOptions {
  std::string train_binary;
  std::string checkpoint_root;
  int threads = 0;                   // > 0: the config's `threads` key
  std::string cuda_visible_devices;  // non-empty: set for the child
  int64_t grace_ms = 10000;          // SIGTERM -> SIGKILL
  // FinishJob retries after Interrupt() give up after this long.
  int64_t shutdown_report_ms = 15000;
  // After the trainer exited, read what its pipes still hold for at most
  // this long.
  int64_t drain_ms = 2000;
  size_t max_stdout_line_bytes = 2 * 1024 * 1024;
  // Per attempt: attempt-<id>.stderr.log and attempt-<id>.events.jsonl
  // each stop growing here.
  int64_t attempt_log_max_bytes = 64 * 1024 * 1024;
  MetricRelayOptions relay;
};

// The report without anything that can make it fail for good: status,
// final step, val loss, a short sanitized reason that says why
// (`why`), the checkpoint path when short. A SUCCEEDED report that carried
// diagnostics becomes FAILED (its results would be lost silently).
depthbench::v1::FinishJobRequest MinimalFinishReport(
    const depthbench::v1::FinishJobRequest& request, const std::string& why);

// Sanitizes every string of `request` that came from the child (reason,
// checkpoint path, diagnostics) to valid, bounded UTF-8 in place.
void SanitizeFinishReport(depthbench::v1::FinishJobRequest* request);

class JobRunner {
 public:
  JobRunner(const SchedulerClient* client, Clock* clock, const WorkerMetrics* metrics,
            JobRunnerOptions options, depthbench::v1::AcquireJobResponse lease,
            std::function<void(JobRunner*)> on_done);
  ~JobRunner();  // joins the thread
  JobRunner(const JobRunner&) = delete;
  JobRunner& operator=(const JobRunner&) = delete;

  void Start();
  // The scheduler ended the attempt (cancelled, expired, superseded).
  void Cancel(const std::string& reason);
  // The worker is shutting down: stop, report INTERRUPTED.
  void Interrupt();

  int64_t job_id() const { return lease_.job_id(); }
  int64_t attempt_id() const { return lease_.attempt_id(); }
  bool done() const;
  // The FinishStatus reported (UNSPECIFIED if none was, e.g. cancelled).
  depthbench::v1::FinishStatus reported() const;

 private:
  void Run();
  // Prepares the run dir and config; returns the argv.
  absl::StatusOr<std::vector<std::string>> Prepare();
  // Prepare() and spawn the trainer with the slot's device and threads.
  absl::StatusOr<std::unique_ptr<ChildProcess>> SpawnTrainer();
  // The relay's hooks: backlog gauge, published marker, stop on a lost lease.
  MetricRelayHooks RelayHooks();
  // What the ended trainer's run reports: its final step, loss and
  // checkpoint, and the status the exit code, done event and stop request
  // make of it (failure detail: common/run_protocol.h).
  void FillReport(const ExitInfo& exit, bool interrupted, depthbench::v1::FinishJobRequest* finish);
  void Supervise(ChildProcess* child, MetricRelay* relay);
  // Supervise's parts: the tree left after the trainer exited, SIGKILL
  // once a stop's grace period is over, and the end-of-run output warnings.
  void KillLeftovers(ChildProcess* child);
  void KillIfGraceOver(ChildProcess* child);
  void WarnAboutOutput();
  void HandleStdoutLine(const std::string& line, MetricRelay* relay);
  void HandleStderrLine(const std::string& line);
  // Re-publishes points of steps (stored_through, resumed_from_step] from
  // earlier attempts' event logs (see the header comment).
  void Replay(int64_t stored_through, int64_t resumed_from_step, MetricRelay* relay);
  // Records that the scheduler stored every point through `step`.
  void MarkPublished(int64_t step);
  void StopChild(bool interrupt, const std::string& reason);
  void Report(depthbench::v1::FinishJobRequest request);
  // Sends points over ReportMetrics (for a report too large to carry
  // them); false if some could not be delivered.
  bool DeliverPoints(const std::vector<depthbench::v1::MetricPoint>& points);
  // Marks the runner done and calls on_done_ (last thing the thread does).
  void Finish(depthbench::v1::FinishStatus reported);

  const SchedulerClient* const client_;
  Clock* const clock_;
  const WorkerMetrics* const metrics_;
  const JobRunnerOptions options_;
  const depthbench::v1::AcquireJobResponse lease_;
  const std::function<void(JobRunner*)> on_done_;
  JobLabels labels_;
  std::string run_dir_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  ChildProcess* child_ ABSL_GUARDED_BY(mu_) = nullptr;  // while running
  MetricRelay* relay_ ABSL_GUARDED_BY(mu_) = nullptr;   // while running
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool interrupted_ ABSL_GUARDED_BY(mu_) = false;
  std::string cancel_reason_ ABSL_GUARDED_BY(mu_);
  int64_t kill_at_ms_ ABSL_GUARDED_BY(mu_) = 0;  // monotonic; 0 = none
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  depthbench::v1::FinishStatus reported_ ABSL_GUARDED_BY(mu_) =
      depthbench::v1::FINISH_STATUS_UNSPECIFIED;

  // Parsed from the child's output; runner thread only.
  int64_t last_step_ = 0;
  bool has_val_loss_ = false;
  double val_loss_ = 0;
  bool saw_done_ = false;
  std::string done_status_, done_reason_;
  std::string checkpoint_path_;
  std::vector<depthbench::v1::DiagnosticResult> diagnostics_;
  // The trainer's `start`: the step it resumed from (FinishJob repeats it).
  std::optional<int64_t> resumed_from_step_;
  std::deque<std::string> stderr_tail_;
  CappedFile stderr_log_;
  CappedFile events_log_;
  RateLimiter stdout_warnings_{5, 0.2};
  int64_t non_event_lines_ = 0;
  std::atomic<int64_t> published_through_{0};
};

}  // namespace depthbench::worker

#endif  // DEPTHBENCH_WORKER_JOB_RUNNER_H_
