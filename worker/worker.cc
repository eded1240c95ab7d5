#include "worker/worker.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace depthbench::worker {

namespace v1 = ::depthbench::v1;

Worker::Worker(WorkerOptions options, const SchedulerClient* client, Clock* clock,
               const WorkerMetrics* metrics)
    : options_(std::move(options)), client_(client), clock_(clock), metrics_(metrics) {
  absl::MutexLock lock(&mu_);
  slots_.resize(std::max(1, options_.slots));
  for (size_t i = 0; i < slots_.size(); ++i) slots_[i].index = static_cast<int>(i);
  UpdateSlotMetrics();
}

Worker::~Worker() {
  Shutdown();
  if (heartbeat_.joinable()) heartbeat_.join();
}

void Worker::Shutdown() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

void Worker::Pause(int64_t ms) {
  absl::MutexLock lock(&mu_);
  auto woken = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || wake_; };
  clock_->AwaitWithTimeout(&mu_, absl::Condition(&woken), ms);
  wake_ = false;
}

void Worker::UpdateSlotMetrics() {
  if (metrics_ == nullptr) return;
  int busy = 0;
  for (const Slot& s : slots_) busy += s.runner != nullptr ? 1 : 0;
  metrics_->SetSlots(busy, static_cast<int>(slots_.size()) - busy);
}

std::vector<v1::RunningAttempt> Worker::HeldAttempts() const {
  std::vector<v1::RunningAttempt> out;
  absl::MutexLock lock(&mu_);
  for (const Slot& s : slots_) {
    if (s.runner == nullptr || s.runner->done()) continue;
    v1::RunningAttempt a;
    a.set_job_id(s.runner->job_id());
    a.set_attempt_id(s.runner->attempt_id());
    out.push_back(a);
  }
  return out;
}

void Worker::ApplyCancellations(
    const google::protobuf::RepeatedPtrField<v1::Cancellation>& cancellations) {
  if (cancellations.empty()) return;
  absl::MutexLock lock(&mu_);
  for (const v1::Cancellation& c : cancellations) {
    for (Slot& s : slots_) {
      if (s.runner != nullptr && s.runner->job_id() == c.job_id() &&
          s.runner->attempt_id() == c.attempt_id()) {
        s.runner->Cancel(c.reason());
      }
    }
  }
}

absl::Status Worker::Register() {
  absl::MutexLock register_lock(&register_mu_);
  int64_t backoff_ms = options_.initial_backoff_ms;
  while (true) {
    v1::RegisterWorkerRequest req;
    req.set_name(options_.name);
    v1::WorkerResources* res = req.mutable_resources();
    res->set_devices(options_.gpus);
    res->set_memory_mb(options_.memory_mb);
    res->set_slots(std::max(1, options_.slots));
    for (const auto& [k, v] : options_.labels) (*res->mutable_labels())[k] = v;
    for (const v1::RunningAttempt& a : HeldAttempts()) *req.add_running() = a;
    absl::StatusOr<v1::RegisterWorkerResponse> resp = client_->RegisterWorker(req);
    if (resp.ok()) {
      int64_t interval = resp->heartbeat_interval_ms() > 0
                             ? resp->heartbeat_interval_ms()
                             : std::max<int64_t>(100, resp->lease_ttl_ms() / 3);
      heartbeat_interval_ms_.store(std::max<int64_t>(50, interval));
      last_ack_ms_.store(clock_->NowMonotonicMs());
      spdlog::info("registered as \"{}\" ({} slot(s), {} running, lease TTL {} ms)",
                   resp->worker_id(), options_.slots, req.running_size(),
                   resp->lease_ttl_ms());
      ApplyCancellations(resp->cancellations());
      return absl::OkStatus();
    }
    if (!IsTransient(resp.status())) return resp.status();
    {
      absl::MutexLock lock(&mu_);
      // While shutting down, heartbeats only keep leases of children that
      // are being stopped; give up rather than block the shutdown.
      if (stopping_ && HeldAttemptsEmptyLocked()) return absl::CancelledError("stopping");
    }
    spdlog::warn("RegisterWorker: {} (retrying in {} ms)", resp.status().ToString(), backoff_ms);
    Pause(backoff_ms);
    backoff_ms = std::min(options_.max_backoff_ms, backoff_ms * 2);
  }
}

bool Worker::HeldAttemptsEmptyLocked() const {
  for (const Slot& s : slots_) {
    if (s.runner != nullptr && !s.runner->done()) return false;
  }
  return true;
}

void Worker::HeartbeatLoop() {
  int64_t retry_ms = 0;  // > 0 after a failed heartbeat
  while (true) {
    int64_t wait = retry_ms > 0 ? retry_ms : heartbeat_interval_ms_.load();
    {
      absl::MutexLock lock(&mu_);
      auto stop = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return heartbeat_stop_; };
      clock_->AwaitWithTimeout(&mu_, absl::Condition(&stop), wait);
      if (heartbeat_stop_) return;
    }
    v1::HeartbeatRequest req;
    req.set_worker_id(options_.name);
    for (const v1::RunningAttempt& a : HeldAttempts()) *req.add_running() = a;
    absl::StatusOr<v1::HeartbeatResponse> resp = client_->Heartbeat(req);
    if (resp.ok()) {
      retry_ms = 0;
      last_ack_ms_.store(clock_->NowMonotonicMs());
      if (resp->lease_ttl_ms() > 0) {
        heartbeat_interval_ms_.store(
            std::min(heartbeat_interval_ms_.load(), std::max<int64_t>(50, resp->lease_ttl_ms() / 3)));
      }
      ApplyCancellations(resp->cancellations());
      continue;
    }
    if (resp.status().code() == absl::StatusCode::kNotFound) {
      spdlog::warn("Heartbeat: {}; registering again", resp.status().ToString());
      absl::Status s = Register();
      if (!s.ok()) spdlog::error("RegisterWorker: {}", s.ToString());
      continue;
    }
    retry_ms = retry_ms == 0 ? options_.initial_backoff_ms
                             : std::min(options_.max_backoff_ms, retry_ms * 2);
    // Retry at least twice per interval: a restarted scheduler grants one
    // TTL (3 intervals) for the first heartbeat to get through.
    retry_ms = std::min(retry_ms, std::max<int64_t>(50, heartbeat_interval_ms_.load() / 2));
    spdlog::warn("Heartbeat: {} (retrying in {} ms)", resp.status().ToString(), retry_ms);
  }
}

void Worker::StartJob(Slot* slot, v1::AcquireJobResponse lease) {
  JobRunnerOptions o;
  o.train_binary = options_.train_binary;
  o.checkpoint_root = options_.checkpoint_root;
  o.threads = options_.threads_per_slot;
  if (options_.gpus > 0) o.cuda_visible_devices = std::to_string(slot->index % options_.gpus);
  o.grace_ms = options_.grace_ms;
  o.attempt_log_max_bytes = options_.attempt_log_max_bytes;
  o.relay = options_.relay;
  slot->runner = std::make_unique<JobRunner>(
      client_, clock_, metrics_, std::move(o), std::move(lease), [this](JobRunner*) {
        absl::MutexLock lock(&mu_);
        wake_ = true;
      });
  slot->runner->Start();
  UpdateSlotMetrics();
}

void Worker::ReapFinished() {
  std::vector<std::unique_ptr<JobRunner>> finished;
  {
    absl::MutexLock lock(&mu_);
    for (Slot& s : slots_) {
      if (s.runner != nullptr && s.runner->done()) finished.push_back(std::move(s.runner));
    }
    if (!finished.empty()) UpdateSlotMetrics();
  }
  finished.clear();  // joins the runner threads, outside mu_
}

absl::Status Worker::Run() {
  absl::Status registered = Register();
  if (!registered.ok()) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return absl::OkStatus();
    }
    return registered;
  }
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  AcquireLoop();
  DrainSlots();
  {
    absl::MutexLock lock(&mu_);
    heartbeat_stop_ = true;
  }
  if (heartbeat_.joinable()) heartbeat_.join();
  spdlog::info("worker stopped");
  return absl::OkStatus();
}

Worker::Slot* Worker::FreeSlot() {
  absl::MutexLock lock(&mu_);
  if (stopping_) return nullptr;
  for (Slot& s : slots_) {
    if (s.runner == nullptr) return &s;
  }
  return nullptr;
}

void Worker::AcquireLoop() {
  int64_t backoff_ms = 0;
  while (true) {
    ReapFinished();
    Slot* free_slot = FreeSlot();
    if (free_slot == nullptr) {
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
      }
      Pause(options_.acquire_poll_ms);
      continue;
    }
    v1::AcquireJobRequest req;
    req.set_worker_id(options_.name);
    absl::StatusOr<v1::AcquireJobResponse> lease = client_->AcquireJob(req);
    if (lease.ok()) {
      backoff_ms = 0;
      if (!lease->has_job()) {
        Pause(options_.acquire_poll_ms);
        continue;
      }
      absl::MutexLock lock(&mu_);
      // Only this thread fills slots, so the slot is still free; a job
      // acquired just as Shutdown() came in still starts and is then
      // interrupted like the others (reported INTERRUPTED, not lost).
      StartJob(free_slot, *std::move(lease));
      continue;
    }
    if (lease.status().code() == absl::StatusCode::kNotFound) {
      spdlog::warn("AcquireJob: {}; registering again", lease.status().ToString());
      absl::Status s = Register();
      if (!s.ok() && !IsTransient(s)) spdlog::error("RegisterWorker: {}", s.ToString());
      continue;
    }
    backoff_ms = backoff_ms == 0 ? options_.initial_backoff_ms
                                 : std::min(options_.max_backoff_ms, backoff_ms * 2);
    if (IsTransient(lease.status())) {
      spdlog::warn("AcquireJob: {} (retrying in {} ms)", lease.status().ToString(), backoff_ms);
    } else {
      spdlog::error("AcquireJob: {} (retrying in {} ms)", lease.status().ToString(), backoff_ms);
    }
    Pause(backoff_ms);
  }
}

void Worker::DrainSlots() {
  // Interrupt every child; heartbeats go on until each has checkpointed and
  // been reported, so their leases do not expire meanwhile.
  int interrupted = 0;
  {
    absl::MutexLock lock(&mu_);
    for (Slot& s : slots_) {
      if (s.runner != nullptr && !s.runner->done()) {
        s.runner->Interrupt();
        ++interrupted;
      }
    }
  }
  if (interrupted > 0) spdlog::info("shutting down: interrupting {} job(s)", interrupted);
  while (true) {
    ReapFinished();
    {
      absl::MutexLock lock(&mu_);
      bool all_free = true;
      for (const Slot& s : slots_) all_free = all_free && s.runner == nullptr;
      if (all_free) break;
    }
    Pause(50);
  }
}

}  // namespace depthbench::worker
