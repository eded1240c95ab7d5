// In-memory leases: which attempt of a job a worker holds, and until when
// (monotonic ms of the injected Clock). Leases are not persisted: monotonic
// time does not survive a restart, so on start the scheduler re-grants every
// leased/running job a fresh TTL (the grace period for workers to re-attach
// with Heartbeat/RegisterWorker) and lets unclaimed ones expire.
//
// Thread safety: none; the Scheduler guards it with its mutex.
#ifndef DEPTHBENCH_SCHEDULER_LEASE_MANAGER_H_
#define DEPTHBENCH_SCHEDULER_LEASE_MANAGER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace depthbench::scheduler {

struct Lease {
  int64_t job_id = 0;
  int64_t attempt_id = 0;
  std::string worker_id;
  int64_t expiry_ms = 0;
  bool running = false;  // the job's state is `running` (else `leased`)
};

class LeaseManager {
 public:
  explicit LeaseManager(int64_t ttl_ms) : ttl_ms_(ttl_ms) {}
  LeaseManager(const LeaseManager&) = delete;
  LeaseManager& operator=(const LeaseManager&) = delete;

  int64_t ttl_ms() const { return ttl_ms_; }
  void Grant(int64_t job_id, int64_t attempt_id, const std::string& worker_id,
             int64_t now_ms, bool running = false);
  // The lease of `job_id` when `attempt_id` holds it.
  Lease* Find(int64_t job_id, int64_t attempt_id);
  // Extends the lease to now + TTL; false when the attempt holds none.
  bool Renew(int64_t job_id, int64_t attempt_id, int64_t now_ms);
  void Release(int64_t job_id);
  // Releases the lease of `job_id` only while `attempt_id` holds it.
  void ReleaseAttempt(int64_t job_id, int64_t attempt_id);
  // Copies of every lease whose expiry is <= now; they stay held until
  // released (the scheduler releases them once the expiry is committed).
  std::vector<Lease> Expired(int64_t now_ms) const;
  int64_t CountForWorker(const std::string& worker_id) const;
  size_t size() const { return leases_.size(); }

 private:
  int64_t ttl_ms_;
  std::map<int64_t, Lease> leases_;  // by job id
};

// Backoff before retry number `attempts_used` + 1 after an infrastructure
// failure: initial * multiplier^(attempts_used - 1), capped at max.
int64_t BackoffMs(int64_t attempts_used, int64_t initial_ms, double multiplier,
                  int64_t max_ms);

}  // namespace depthbench::scheduler

#endif  // DEPTHBENCH_SCHEDULER_LEASE_MANAGER_H_
