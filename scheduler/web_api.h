// The scheduler's web view: the pages (scheduler/web/, embedded at build
// time by scheduler/web/embed.cmake) and the read-only JSON endpoints they
// poll, answered from the Scheduler's read paths (ReaderPool snapshots;
// every list is paged, results come aggregated per (arch, shape) group).
// docs/WEB.md documents every endpoint and field.
//
//   GET /                               index.html (the single-page app)
//   GET /static/NAME                    its scripts, styles, uPlot, LICENSE
//   GET /api/sweeps                     sweeps with progress and ETA (paged)
//   GET /api/sweeps/NAME                one sweep (+ its spec)
//   GET /api/sweeps/NAME/results        result rows + the per-design
//                                       val-loss-vs-aspect-ratio series
//   GET /api/sweeps/NAME/runs           train runs (paged)
//   GET /api/jobs?sweep=&state=         jobs (paged)
//   GET /api/jobs/ID                    one job with its attempts
//   GET /api/jobs/ID/points?since=ROW   metric points after a row cursor
//   GET /api/jobs/ID/diagnostics        its diagnostics (angular, causal, ...)
//
// Auth: with a token, every /api/ path needs "Authorization: Bearer TOKEN"
// (401 otherwise, no data). The page shell and static files hold no data
// and are served without it: the shell shows the login form until the API
// accepts the token it sends.
//
// ETA: each /api/sweeps or /api/sweeps/NAME answer records (now, done jobs)
// per sweep; throughput is measured over the last kEtaWindowMs of those
// samples (since the sweep's creation until two samples span 5 s).
//
// Sweep progress (ListSweeps, GetSweep) counts a sweep's jobs by state, which
// costs O(jobs) (~0.1 s at 100,000 jobs; bench/RESULTS.md): those answers are
// shared for kProgressCacheMs, so any number of open pages costs at most one
// count per sweep (and list page) a second.
//
// Thread safety: Handle() may be called concurrently (the sample table and
// the cache have their own lock). Ownership: borrows the Scheduler and the
// Clock.
#ifndef DEPTHBENCH_SCHEDULER_WEB_API_H_
#define DEPTHBENCH_SCHEDULER_WEB_API_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "scheduler/scheduler.h"
#include "scheduler/web_server.h"

namespace depthbench::scheduler {

class WebApi {
 public:
  static constexpr int64_t kEtaWindowMs = 5 * 60 * 1000;
  static constexpr int64_t kMaxPointsPerRead = 5000;
  static constexpr int64_t kProgressCacheMs = 1000;

  // `auth_token` empty: no token needed.
  WebApi(Scheduler* scheduler, Clock* clock, std::string auth_token);

  WebResponse Handle(const WebRequest& request);

 private:
  WebResponse Api(const WebRequest& request);
  // Api's routes and their steps (one per endpoint, docs/WEB.md).
  WebResponse NoEndpoint(const std::string& path);
  WebResponse ListSweepsRoute(const WebRequest& request, const std::string& path_rest);
  WebResponse SweepRoute(const WebRequest& request, const std::string& path_rest);
  WebResponse SweepDetail(const std::string& name);
  WebResponse SweepResults(const std::string& name);
  WebResponse SweepRuns(const WebRequest& request, const std::string& name);
  WebResponse ListJobsRoute(const WebRequest& request, const std::string& path_rest);
  WebResponse JobRoute(const WebRequest& request, const std::string& path_rest);
  WebResponse JobPoints(const WebRequest& request, int64_t id);
  WebResponse JobDiagnostics(int64_t id);
  nlohmann::json SweepJson(const depthbench::v1::Sweep& s);
  bool Authorized(const std::string& header) const;

  // (throughput in jobs/s, ETA in s); negative: unknown.
  std::pair<double, double> Progress(const std::string& sweep, int64_t created_ms,
                                     int64_t done, int64_t total, bool running);

  absl::StatusOr<depthbench::v1::ListSweepsResponse> ListSweeps(
      const depthbench::v1::ListSweepsRequest& request);
  absl::StatusOr<depthbench::v1::Sweep> GetSweep(const std::string& name);

  Scheduler* const scheduler_;
  Clock* const clock_;
  const std::string auth_token_;

  absl::Mutex mu_;
  // sweep name -> (monotonic ms, done jobs), oldest first, within the window.
  std::map<std::string, std::deque<std::pair<int64_t, int64_t>>> samples_ ABSL_GUARDED_BY(mu_);
  // Recent progress answers: key -> (monotonic ms, answer).
  std::map<std::string, std::pair<int64_t, depthbench::v1::ListSweepsResponse>> list_cache_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::pair<int64_t, depthbench::v1::Sweep>> sweep_cache_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace depthbench::scheduler

#endif  // DEPTHBENCH_SCHEDULER_WEB_API_H_
