#include "scheduler/lease_manager.h"

#include <algorithm>
#include <cmath>

namespace depthbench::scheduler {

void LeaseManager::Grant(int64_t job_id, int64_t attempt_id,
                         const std::string& worker_id, int64_t now_ms,
                         bool running) {
  leases_[job_id] = Lease{job_id, attempt_id, worker_id, now_ms + ttl_ms_, running};
}

Lease* LeaseManager::Find(int64_t job_id, int64_t attempt_id) {
  auto it = leases_.find(job_id);
  if (it == leases_.end() || it->second.attempt_id != attempt_id) return nullptr;
  return &it->second;
}

bool LeaseManager::Renew(int64_t job_id, int64_t attempt_id, int64_t now_ms) {
  Lease* lease = Find(job_id, attempt_id);
  if (lease == nullptr) return false;
  lease->expiry_ms = std::max(lease->expiry_ms, now_ms + ttl_ms_);
  return true;
}

void LeaseManager::Release(int64_t job_id) { leases_.erase(job_id); }

void LeaseManager::ReleaseAttempt(int64_t job_id, int64_t attempt_id) {
  auto it = leases_.find(job_id);
  if (it != leases_.end() && it->second.attempt_id == attempt_id) leases_.erase(it);
}

std::vector<Lease> LeaseManager::Expired(int64_t now_ms) const {
  std::vector<Lease> out;
  for (const auto& [id, lease] : leases_) {
    if (lease.expiry_ms <= now_ms) out.push_back(lease);
  }
  return out;
}

int64_t LeaseManager::CountForWorker(const std::string& worker_id) const {
  int64_t n = 0;
  for (const auto& [id, lease] : leases_) n += lease.worker_id == worker_id;
  return n;
}

int64_t BackoffMs(int64_t attempts_used, int64_t initial_ms, double multiplier,
                  int64_t max_ms) {
  if (attempts_used <= 0) return 0;
  double backoff = static_cast<double>(initial_ms) *
                   std::pow(multiplier, static_cast<double>(attempts_used - 1));
  if (!(backoff < static_cast<double>(max_ms))) return max_ms;
  return static_cast<int64_t>(backoff);
}

}  // namespace depthbench::scheduler
