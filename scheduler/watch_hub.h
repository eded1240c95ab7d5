// Fan-out of live metric points and state changes to WatchJob streams, kept
// off the ingestion path: after a commit, the scheduler copies the points it
// stored into the watched job's ring (one copy however many watch it) and
// wakes only that job's watchers; watchers then read the ring under the
// hub's own mutex, never the scheduler's. A state change (any job) bumps one
// epoch and wakes every watcher, which then reads its job's state.
//
// A watcher's cursor is the row id of the last point it has seen. The ring
// keeps a job's last `ring_capacity` points; a watcher whose cursor falls
// behind what was evicted is told (`lost`) and reads SQLite instead.
//
// Thread safety: every method is thread-safe. Publish/StateChanged may be
// called with the scheduler's mutex held (the hub takes only its own mutex,
// and never calls out). Ownership: channels are shared by the hub's index
// (weakly) and their subscribers; a channel lives while subscribed.
#ifndef DEPTHBENCH_SCHEDULER_WATCH_HUB_H_
#define DEPTHBENCH_SCHEDULER_WATCH_HUB_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "storage/records.h"

namespace depthbench::scheduler {

class WatchHub {
 public:
  class Channel;

  explicit WatchHub(size_t ring_capacity = 2048) : ring_capacity_(ring_capacity) {}
  WatchHub(const WatchHub&) = delete;
  WatchHub& operator=(const WatchHub&) = delete;

  // The job's channel, created when nobody watched it yet. It holds every
  // point published from now on (up to the ring's capacity), so subscribe
  // before (or while holding the lock of) the storage read it continues.
  std::shared_ptr<Channel> Subscribe(int64_t job_id);

  // Points of `job_id` just committed, in row-id order. A no-op (one map
  // lookup) when nobody watches the job.
  void Publish(int64_t job_id, const std::vector<storage::MetricRecord>& points);

  // Some job's state changed: bumps state_epoch() and wakes every watcher.
  void StateChanged();
  uint64_t state_epoch() const;

  struct Taken {
    std::vector<storage::MetricRecord> points;  // step >= from_step, by row id
    int64_t cursor = 0;    // row id of the last point examined
    bool lost = false;     // the ring no longer holds every point after the cursor
    uint64_t epoch = 0;    // state_epoch() when taken
  };
  // Waits until the channel holds a point after `after_row_id`, the ring
  // lost some, state_epoch() != seen_epoch, or `timeout` passes; then takes
  // up to `limit` points after `after_row_id` (skipping steps < from_step).
  Taken Wait(Channel& channel, int64_t after_row_id, int64_t from_step, int64_t limit,
             uint64_t seen_epoch, absl::Duration timeout);

 private:
  Taken TakeLocked(Channel& channel, int64_t after_row_id, int64_t from_step, int64_t limit)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t ring_capacity_;
  mutable absl::Mutex mu_;
  std::map<int64_t, std::weak_ptr<Channel>> channels_ ABSL_GUARDED_BY(mu_);
  uint64_t state_epoch_ ABSL_GUARDED_BY(mu_) = 0;
};

// One job's ring. Opaque outside the hub; its fields are guarded by the
// hub's mutex.
class WatchHub::Channel {
 public:
  Channel() = default;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

 private:
  friend class WatchHub;
  std::deque<storage::MetricRecord> ring;
  int64_t evicted_row = 0;  // largest row id dropped from the ring
  absl::CondVar cv;
};

}  // namespace depthbench::scheduler

#endif  // DEPTHBENCH_SCHEDULER_WATCH_HUB_H_
