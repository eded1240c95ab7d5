#include "scheduler/watch_hub.h"

#include <algorithm>

namespace depthbench::scheduler {

std::shared_ptr<WatchHub::Channel> WatchHub::Subscribe(int64_t job_id) {
  absl::MutexLock lock(&mu_);
  std::weak_ptr<Channel>& slot = channels_[job_id];
  std::shared_ptr<Channel> channel = slot.lock();
  if (channel == nullptr) {
    channel = std::make_shared<Channel>();
    slot = channel;
  }
  return channel;
}

void WatchHub::Publish(int64_t job_id, const std::vector<storage::MetricRecord>& points) {
  if (points.empty()) return;
  absl::MutexLock lock(&mu_);
  auto it = channels_.find(job_id);
  if (it == channels_.end()) return;
  std::shared_ptr<Channel> channel = it->second.lock();
  if (channel == nullptr) {  // its last watcher left
    channels_.erase(it);
    return;
  }
  for (const storage::MetricRecord& p : points) {
    channel->ring.push_back(p);
    if (channel->ring.size() > ring_capacity_) {
      channel->evicted_row = channel->ring.front().row_id;
      channel->ring.pop_front();
    }
  }
  channel->cv.SignalAll();
}

void WatchHub::StateChanged() {
  absl::MutexLock lock(&mu_);
  ++state_epoch_;
  for (auto it = channels_.begin(); it != channels_.end();) {
    std::shared_ptr<Channel> channel = it->second.lock();
    if (channel == nullptr) {
      it = channels_.erase(it);
      continue;
    }
    channel->cv.SignalAll();
    ++it;
  }
}

uint64_t WatchHub::state_epoch() const {
  absl::MutexLock lock(&mu_);
  return state_epoch_;
}

WatchHub::Taken WatchHub::TakeLocked(Channel& channel, int64_t after_row_id, int64_t from_step,
                                     int64_t limit) {
  Taken taken;
  taken.cursor = after_row_id;
  taken.epoch = state_epoch_;
  if (channel.evicted_row > after_row_id) {
    taken.lost = true;
    return taken;
  }
  auto first = std::upper_bound(
      channel.ring.begin(), channel.ring.end(), after_row_id,
      [](int64_t row, const storage::MetricRecord& p) { return row < p.row_id; });
  for (auto it = first; it != channel.ring.end(); ++it) {
    if (static_cast<int64_t>(taken.points.size()) >= limit) break;
    taken.cursor = it->row_id;
    if (it->step >= from_step) taken.points.push_back(*it);
  }
  return taken;
}

WatchHub::Taken WatchHub::Wait(Channel& channel, int64_t after_row_id, int64_t from_step,
                               int64_t limit, uint64_t seen_epoch, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  absl::Time deadline = absl::Now() + timeout;
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return state_epoch_ != seen_epoch || channel.evicted_row > after_row_id ||
           (!channel.ring.empty() && channel.ring.back().row_id > after_row_id);
  };
  while (!ready()) {
    if (channel.cv.WaitWithDeadline(&mu_, deadline)) break;
  }
  return TakeLocked(channel, after_row_id, from_step, limit);
}

}  // namespace depthbench::scheduler
