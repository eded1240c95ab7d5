#include "worker/metric_relay.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace depthbench::worker {

namespace v1 = ::depthbench::v1;

MetricRelay::MetricRelay(const SchedulerClient* client, int64_t job_id, int64_t attempt_id,
                         MetricRelayOptions options, MetricRelayHooks hooks)
    : client_(client),
      job_id_(job_id),
      attempt_id_(attempt_id),
      options_(options),
      hooks_(std::move(hooks)) {
  sender_ = std::thread([this] { SenderLoop(); });
}

MetricRelay::~MetricRelay() { Close(); }

bool MetricRelay::Push(std::vector<v1::MetricPoint> points) {
  if (points.empty()) return true;
  int64_t added = 0;
  {
    absl::MutexLock lock(&mu_);
    auto can_push = [this, n = points.size()]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return closing_ || stale_ || unblocked_ || buffer_.empty() ||
             buffer_.size() + n <= options_.capacity;
    };
    mu_.Await(absl::Condition(&can_push));
    if (closing_ || stale_) return false;
    for (v1::MetricPoint& p : points) buffer_.push_back(std::move(p));
    added = static_cast<int64_t>(points.size());
  }
  if (hooks_.on_backlog) hooks_.on_backlog(added);
  return true;
}

void MetricRelay::Announce(std::optional<int64_t> resumed_from_step) {
  absl::MutexLock lock(&mu_);
  announce_ = true;
  if (resumed_from_step) resume_owed_ = resumed_from_step;
}

void MetricRelay::Unblock() {
  absl::MutexLock lock(&mu_);
  unblocked_ = true;
}

bool MetricRelay::stale() const {
  absl::MutexLock lock(&mu_);
  return stale_;
}

int64_t MetricRelay::sent_points() const {
  absl::MutexLock lock(&mu_);
  return sent_;
}

std::vector<v1::MetricPoint> MetricRelay::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return {};
    closing_ = true;
  }
  if (sender_.joinable()) sender_.join();
  std::vector<v1::MetricPoint> rest;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    rest.assign(std::make_move_iterator(buffer_.begin()),
                std::make_move_iterator(buffer_.end()));
    buffer_.clear();
  }
  if (hooks_.on_backlog && !rest.empty()) hooks_.on_backlog(-static_cast<int64_t>(rest.size()));
  return rest;
}

bool MetricRelay::NextChunk(int64_t backoff_ms, v1::ReportMetricsRequest* chunk) {
  auto closing = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return closing_ || stale_; };
  auto any = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return closing_ || stale_ || announce_ || !buffer_.empty();
  };
  auto full = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return closing_ || stale_ || announce_ || buffer_.size() >= options_.batch;
  };
  const Clock* clock = options_.clock != nullptr ? options_.clock : RealClock::Default();
  while (true) {
    absl::MutexLock lock(&mu_);
    if (backoff_ms > 0) {
      // Back off (a full buffer does not cut it short); closing does.
      clock->AwaitWithTimeout(&mu_, absl::Condition(&closing), backoff_ms);
    } else {
      // Wait for points, then for a full batch or the flush deadline.
      mu_.Await(absl::Condition(&any));
      clock->AwaitWithTimeout(&mu_, absl::Condition(&full), options_.flush_ms);
    }
    // Closing: the rest goes with FinishJob.
    if (closing_ || stale_) return false;
    if (buffer_.empty() && !announce_) continue;
    announce_ = false;
    size_t n = std::min(options_.batch, buffer_.size());
    chunk->set_job_id(job_id_);
    chunk->set_attempt_id(attempt_id_);
    if (resume_owed_) chunk->set_resumed_from_step(*resume_owed_);
    for (size_t i = 0; i < n; ++i) *chunk->add_points() = buffer_[i];
    return true;
  }
}

void MetricRelay::Acknowledge(const v1::ReportMetricsRequest& chunk) {
  const int64_t n = chunk.points_size();
  int64_t acked_through = 0;
  {
    absl::MutexLock lock(&mu_);
    // Only the sender thread removes points, so the front is still this
    // batch (Close() waits for that thread before touching the buffer).
    for (int64_t i = 0; i < n && !buffer_.empty(); ++i) buffer_.pop_front();
    sent_ += n;
    if (chunk.has_resumed_from_step() && resume_owed_ == chunk.resumed_from_step()) {
      resume_owed_.reset();
    }
    if (n > 0) {
      const int64_t last = chunk.points(static_cast<int>(n) - 1).step();
      acked_through = buffer_.empty() ? last : std::min(last, buffer_.front().step() - 1);
    }
  }
  if (hooks_.on_backlog) hooks_.on_backlog(-n);
  if (n > 0 && hooks_.on_acked) hooks_.on_acked(acked_through);
}

void MetricRelay::BecomeStale(const absl::Status& status) {
  int64_t dropped = 0;
  {
    absl::MutexLock lock(&mu_);
    stale_ = true;
    dropped = static_cast<int64_t>(buffer_.size());
    buffer_.clear();
  }
  if (hooks_.on_backlog && dropped > 0) hooks_.on_backlog(-dropped);
  if (hooks_.on_stale) hooks_.on_stale(std::string(status.message()));
}

void MetricRelay::SenderLoop() {
  int64_t backoff_ms = 0;  // > 0 after a transient failure
  while (true) {
    v1::ReportMetricsRequest chunk;
    if (!NextChunk(backoff_ms, &chunk)) return;
    absl::StatusOr<v1::ReportMetricsResponse> sent = client_->ReportMetrics({chunk});
    const int64_t n = chunk.points_size();
    if (sent.ok()) {
      backoff_ms = 0;
      Acknowledge(chunk);
      if (!sent->stop_reason().empty()) {
        // The scheduler ended the job with these points (successive
        // halving paused or pruned it): the attempt is over, as for a lost
        // lease.
        BecomeStale(absl::AbortedError(sent->stop_reason()));
        return;
      }
      continue;
    }
    const absl::Status& s = sent.status();
    if (s.code() == absl::StatusCode::kFailedPrecondition) {
      BecomeStale(s);
      return;
    }
    if (IsTransient(s)) {
      if (n == 0) {
        absl::MutexLock lock(&mu_);
        announce_ = true;  // the announcement is still owed
      }
      backoff_ms = backoff_ms == 0 ? options_.initial_backoff_ms
                                   : std::min(options_.max_backoff_ms, backoff_ms * 2);
      spdlog::debug("job {} attempt {}: ReportMetrics: {} (retrying in {} ms)", job_id_,
                    attempt_id_, s.ToString(), backoff_ms);
      continue;
    }
    // A permanent error for this batch (a bug on one side): drop it rather
    // than retrying forever, and say so.
    spdlog::error("job {} attempt {}: ReportMetrics refused {} points: {}", job_id_,
                  attempt_id_, n, s.ToString());
    {
      absl::MutexLock lock(&mu_);
      for (int64_t i = 0; i < n && !buffer_.empty(); ++i) buffer_.pop_front();
    }
    if (hooks_.on_backlog) hooks_.on_backlog(-n);
  }
}

}  // namespace depthbench::worker
