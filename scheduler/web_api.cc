#include "scheduler/web_api.h"

#include <openssl/crypto.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <google/protobuf/util/json_util.h>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "scheduler/web_assets.h"
#include "storage/job_text.h"

namespace depthbench::scheduler {
namespace {

namespace v1 = depthbench::v1;
using json = nlohmann::json;

WebResponse Json(int status, const json& body) {
  WebResponse r;
  r.status = status;
  r.content_type = "application/json";
  // NaN and infinities become null (nlohmann's dump does so); bytes that are
  // not UTF-8 (a trainer's stderr in a failure reason) become U+FFFD instead
  // of failing the answer.
  r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  r.headers.push_back({"Cache-Control", "no-store"});
  return r;
}

WebResponse Error(int status, const std::string& message) {
  return Json(status, json{{"error", message}});
}

WebResponse FromStatus(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kNotFound: return Error(404, std::string(s.message()));
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange: return Error(400, std::string(s.message()));
    case absl::StatusCode::kUnavailable: return Error(503, std::string(s.message()));
    default: return Error(500, std::string(s.message()));
  }
}

// An optional integer query parameter: `def` when absent; InvalidArgument
// naming `name` when it is not an integer in [lo, hi].
absl::StatusOr<int64_t> IntParam(const WebRequest& r, const std::string& name, int64_t def,
                                 int64_t lo, int64_t hi) {
  auto it = r.query.find(name);
  if (it == r.query.end() || it->second.empty()) return def;
  int64_t v = 0;
  if (!absl::SimpleAtoi(it->second, &v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": \"", it->second,
                                                   "\" is not an integer in [", lo, ", ", hi,
                                                   "]"));
  }
  return v;
}

std::string Param(const WebRequest& r, const std::string& name) {
  auto it = r.query.find(name);
  return it == r.query.end() ? std::string() : it->second;
}

const char* SweepStateName(v1::SweepState s) {
  switch (s) {
    case v1::SWEEP_RUNNING: return "running";
    case v1::SWEEP_COMPLETED: return "completed";
    case v1::SWEEP_CANCELLED: return "cancelled";
    default: return "unknown";
  }
}

json Maybe(bool has, double v) { return has ? json(v) : json(nullptr); }

json AttemptJson(const v1::Attempt& a) {
  return json{{"attempt_id", a.attempt_id()},
              {"number", a.number()},
              {"worker_id", a.worker_id()},
              {"start_ms", a.start_ms()},
              {"end_ms", a.end_ms()},
              {"outcome", a.outcome()},
              {"reason", a.reason()},
              {"resumed_from_step",
               a.has_resumed_from_step() ? json(a.resumed_from_step()) : json(nullptr)}};
}

json JobJson(const v1::Job& j, bool with_config) {
  json out{{"id", j.id()},
           {"sweep", j.sweep_name()},
           {"kind", storage::JobKindText(j.kind())},
           {"state", storage::JobStateText(j.state())},
           {"arch", j.arch()},
           {"layers", j.layers()},
           {"d_model", j.d_model()},
           {"lr", j.lr()},
           {"seed", j.seed()},
           {"attempts_used", j.attempts_used()},
           {"max_attempts", j.max_attempts()},
           {"worker_id", j.worker_id()},
           {"val_loss", Maybe(j.has_val_loss(), j.final_val_loss())},
           {"final_step", j.final_step()},
           {"reason", j.reason()},
           {"is_best", j.is_best()},
           {"parent_job_id", j.parent_job_id()},
           {"not_before_ms", j.not_before_ms()}};
  if (with_config) {
    json config = json::parse(j.config_json(), nullptr, false);
    out["config"] = config.is_discarded() ? json(j.config_json()) : config;
    json attempts = json::array();
    for (const v1::Attempt& a : j.attempts()) attempts.push_back(AttemptJson(a));
    out["attempts"] = std::move(attempts);
  }
  return out;
}

// A number at doc[kind][field], or null.
json NumberAt(const json& doc, const char* kind, const char* field) {
  if (!doc.is_object() || !doc.contains(kind) || !doc[kind].is_object()) return nullptr;
  const json& k = doc[kind];
  if (!k.contains(field) || !k[field].is_number()) return nullptr;
  return k[field];
}

// The results table's summaries of a row's diagnostics (README.md "What the
// results table's summaries mean").
json DiagnosticsSummary(const std::string& diagnostics_json) {
  json doc = json::parse(diagnostics_json, nullptr, false);
  json s{{"r_causal", NumberAt(doc, "causal", "r_causal")},
         {"r_perm", NumberAt(doc, "permutation", "r_perm")},
         {"deff_over_l", NumberAt(doc, "deff", "deff_over_l")},
         {"kinds", json::array()}};
  if (doc.is_object()) {
    for (auto& [kind, data] : doc.items()) s["kinds"].push_back(kind);
    if (doc.contains("causal") && doc["causal"].is_object()) {
      const json& c = doc["causal"];
      s["causal_form"] = c.contains("form") && c["form"].is_string() ? c["form"] : json("legacy");
    }
  }
  return s;
}

json RowJson(const v1::ResultRow& r) {
  json lrs = json::array();
  for (const v1::LrLoss& l : r.lrs()) {
    lrs.push_back(json{{"lr", l.lr()},
                       {"val_loss", Maybe(l.has_loss(), l.val_loss())},
                       {"diverged", l.diverged()},
                       {"succeeded", l.succeeded()},
                       {"diverged_runs", l.diverged_runs()},
                       {"failed_runs", l.failed_runs()}});
  }
  return json{{"arch", r.arch()},
              {"layers", r.layers()},
              {"d_model", r.d_model()},
              {"aspect_ratio", r.aspect_ratio()},
              {"params", r.params()},
              {"best_lr", Maybe(r.has_best(), r.best_lr())},
              {"best_val_loss", Maybe(r.has_best(), r.best_val_loss())},
              {"best_job_id", r.has_best() ? json(r.best_job_id()) : json(nullptr)},
              {"complete", r.complete()},
              {"budget_tokens", r.budget_tokens()},
              {"budget_steps", r.budget_steps()},
              {"diagnosed_job_id", r.diagnosed_job_id() ? json(r.diagnosed_job_id()) : json(nullptr)},
              {"diagnosed_lr", r.diagnosed_job_id() ? json(r.diagnosed_lr()) : json(nullptr)},
              {"diagnostics", DiagnosticsSummary(r.diagnostics_json())},
              {"lrs", std::move(lrs)}};
}

json RunJson(const v1::RunSummary& r) {
  return json{{"job_id", r.job_id()},
              {"arch", r.arch()},
              {"layers", r.layers()},
              {"d_model", r.d_model()},
              {"lr", r.lr()},
              {"seed", r.seed()},
              {"state", storage::JobStateText(r.state())},
              {"val_loss", Maybe(r.has_val_loss(), r.final_val_loss())},
              {"final_step", r.final_step()},
              {"is_best", r.is_best()}};
}

// /api/jobs/ID[/...] -> (ID, rest); false when ID is not a positive integer.
bool SplitJobPath(const std::string& rest, int64_t* id, std::string* tail) {
  const size_t slash = rest.find('/');
  const std::string head = rest.substr(0, slash);
  *tail = slash == std::string::npos ? "" : rest.substr(slash);
  return absl::SimpleAtoi(head, id) && *id > 0;
}

}  // namespace

WebApi::WebApi(Scheduler* scheduler, Clock* clock, std::string auth_token)
    : scheduler_(scheduler), clock_(clock), auth_token_(std::move(auth_token)) {}

bool WebApi::Authorized(const std::string& header) const {
  if (auth_token_.empty()) return true;
  static constexpr char kPrefix[] = "Bearer ";
  if (!absl::StartsWith(header, kPrefix)) return false;
  const std::string given = header.substr(sizeof(kPrefix) - 1);
  if (given.size() != auth_token_.size()) return false;
  return CRYPTO_memcmp(given.data(), auth_token_.data(), given.size()) == 0;
}

WebResponse WebApi::Handle(const WebRequest& request) {
  const std::string& path = request.path;
  if (absl::StartsWith(path, "/api/") || path == "/api") {
    if (!Authorized(request.authorization)) {
      WebResponse r = Error(401, request.authorization.empty()
                                     ? "authorization: a token is required (Bearer)"
                                     : "authorization: wrong token");
      r.headers.push_back({"WWW-Authenticate", "Bearer realm=\"depthbench\""});
      return r;
    }
    return Api(request);
  }
  std::string name;
  if (path == "/" || path == "/index.html") {
    name = "index.html";
  } else if (absl::StartsWith(path, "/static/")) {
    name = path.substr(8);
  }
  const WebAsset* asset = name.empty() ? nullptr : FindWebAsset(name);
  if (asset == nullptr) {
    WebResponse r;
    r.status = 404;
    r.content_type = "text/plain; charset=utf-8";
    r.body = "not found\n";
    return r;
  }
  WebResponse r;
  r.content_type = asset->content_type;
  r.body.assign(reinterpret_cast<const char*>(asset->data), asset->size);
  r.headers.push_back({"Cache-Control", "no-cache"});
  r.headers.push_back({"X-Content-Type-Options", "nosniff"});
  // Nothing outside this origin: no CDN, no inline scripts.
  r.headers.push_back({"Content-Security-Policy",
                       "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' "
                       "data:; frame-ancestors 'none'"});
  return r;
}

absl::StatusOr<v1::ListSweepsResponse> WebApi::ListSweeps(const v1::ListSweepsRequest& request) {
  const std::string key = absl::StrCat(request.page_size(), "/", request.page_token());
  const int64_t now = clock_->NowMonotonicMs();
  {
    absl::MutexLock lock(&mu_);
    auto it = list_cache_.find(key);
    if (it != list_cache_.end() && now - it->second.first < kProgressCacheMs) {
      return it->second.second;
    }
  }
  absl::StatusOr<v1::ListSweepsResponse> fresh = scheduler_->ListSweeps(request);
  if (fresh.ok()) {
    absl::MutexLock lock(&mu_);
    if (list_cache_.size() > 256) list_cache_.clear();
    list_cache_[key] = {now, *fresh};
  }
  return fresh;
}

absl::StatusOr<v1::Sweep> WebApi::GetSweep(const std::string& name) {
  const int64_t now = clock_->NowMonotonicMs();
  {
    absl::MutexLock lock(&mu_);
    auto it = sweep_cache_.find(name);
    if (it != sweep_cache_.end() && now - it->second.first < kProgressCacheMs) {
      return it->second.second;
    }
  }
  absl::StatusOr<v1::Sweep> fresh = scheduler_->GetSweep(name);
  if (fresh.ok()) {
    absl::MutexLock lock(&mu_);
    if (sweep_cache_.size() > 256) sweep_cache_.clear();
    sweep_cache_[name] = {now, *fresh};
  }
  return fresh;
}

std::pair<double, double> WebApi::Progress(const std::string& sweep, int64_t created_ms,
                                           int64_t done, int64_t total, bool running) {
  const int64_t now = clock_->NowMonotonicMs();
  double rate = -1;  // jobs per second
  {
    absl::MutexLock lock(&mu_);
    auto& q = samples_[sweep];
    if (q.empty() || q.back().second != done || now - q.back().first >= 1000) {
      q.push_back({now, done});
    }
    while (q.size() > 2 && now - q[1].first > kEtaWindowMs) q.pop_front();
    if (q.size() >= 2 && q.back().first - q.front().first >= 5000) {
      rate = static_cast<double>(q.back().second - q.front().second) * 1000.0 /
             static_cast<double>(q.back().first - q.front().first);
    }
  }
  if (rate < 0) {
    // Not watched long enough: the average since the sweep was created.
    const int64_t age_ms = clock_->NowWallMs() - created_ms;
    if (age_ms >= 1000) rate = static_cast<double>(done) * 1000.0 / static_cast<double>(age_ms);
  }
  double eta = -1;
  if (!running) {
    eta = 0;
  } else if (rate > 0) {
    eta = static_cast<double>(total - done) / rate;
  }
  return {rate, eta};
}

json WebApi::SweepJson(const v1::Sweep& s) {
  json counts = json::object();
  for (const auto& [state, n] : s.job_counts()) counts[state] = n;
  const bool running = s.state() == v1::SWEEP_RUNNING;
  auto [rate, eta] = Progress(s.name(), s.created_ms(), s.done_jobs(), s.total_jobs(), running);
  json archs = json::array();
  for (const std::string& a : s.spec().architectures()) archs.push_back(a);
  return json{{"name", s.name()},
              {"id", s.id()},
              {"state", SweepStateName(s.state())},
              {"created_ms", s.created_ms()},
              {"total_jobs", s.total_jobs()},
              {"done_jobs", s.done_jobs()},
              {"job_counts", std::move(counts)},
              {"architectures", std::move(archs)},
              {"jobs_per_minute", rate >= 0 ? json(rate * 60.0) : json(nullptr)},
              {"eta_s", eta >= 0 ? json(eta) : json(nullptr)}};
}

// The API's routes: a path (or a path prefix, the rest handed to the
// handler) and its handler.
WebResponse WebApi::Api(const WebRequest& request) {
  struct Route {
    const char* path;
    bool prefix;
    WebResponse (WebApi::*handle)(const WebRequest&, const std::string& rest);
  };
  static constexpr Route kRoutes[] = {
      {"/api/sweeps", false, &WebApi::ListSweepsRoute},
      {"/api/sweeps/", true, &WebApi::SweepRoute},
      {"/api/jobs", false, &WebApi::ListJobsRoute},
      {"/api/jobs/", true, &WebApi::JobRoute},
  };
  const std::string& path = request.path;
  for (const Route& route : kRoutes) {
    const std::string prefix = route.path;
    if (route.prefix ? absl::StartsWith(path, prefix) : path == prefix) {
      return (this->*route.handle)(request, path.substr(prefix.size()));
    }
  }
  return NoEndpoint(path);
}

WebResponse WebApi::NoEndpoint(const std::string& path) {
  return Error(404, absl::StrCat("no endpoint ", path, " (docs/WEB.md lists them)"));
}

WebResponse WebApi::ListSweepsRoute(const WebRequest& request, const std::string&) {
  v1::ListSweepsRequest req;
  absl::StatusOr<int64_t> page_size = IntParam(request, "page_size", 100, 1, 1000);
  if (!page_size.ok()) return FromStatus(page_size.status());
  req.set_page_size(static_cast<int32_t>(*page_size));
  req.set_page_token(Param(request, "page_token"));
  absl::StatusOr<v1::ListSweepsResponse> list = ListSweeps(req);
  if (!list.ok()) return FromStatus(list.status());
  json sweeps = json::array();
  for (const v1::Sweep& s : list->sweeps()) sweeps.push_back(SweepJson(s));
  return Json(200, json{{"sweeps", std::move(sweeps)},
                        {"next_page_token", list->next_page_token()}});
}

// /api/sweeps/NAME, /api/sweeps/NAME/results, /api/sweeps/NAME/runs.
WebResponse WebApi::SweepRoute(const WebRequest& request, const std::string& path_rest) {
  std::string name = path_rest;
  std::string tail;
  for (const char* suffix : {"/results", "/runs"}) {
    if (absl::EndsWith(name, suffix)) {
      tail = suffix;
      name = name.substr(0, name.size() - tail.size());
      break;
    }
  }
  if (name.empty()) return Error(404, "sweep: name is empty");
  if (tail == "/results") return SweepResults(name);
  if (tail == "/runs") return SweepRuns(request, name);
  return SweepDetail(name);
}

WebResponse WebApi::SweepDetail(const std::string& name) {
  absl::StatusOr<v1::Sweep> s = GetSweep(name);
  if (!s.ok()) return FromStatus(s.status());
  json out = SweepJson(*s);
  std::string spec;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  if (google::protobuf::util::MessageToJsonString(s->spec(), &spec, options).ok()) {
    out["spec"] = json::parse(spec, nullptr, false);
  }
  return Json(200, out);
}

WebResponse WebApi::SweepResults(const std::string& name) {
  v1::QueryResultsRequest req;
  req.set_sweep(name);
  // Rows come on the first page; one run is the least a page holds.
  req.set_page_size(1);
  absl::StatusOr<v1::QueryResultsResponse> res = scheduler_->QueryResults(req);
  if (!res.ok()) return FromStatus(res.status());
  json rows = json::array();
  // Figure 2: the best validation loss against aspect ratio d/L, one
  // series per design, by aspect ratio.
  std::map<std::string, std::vector<const v1::ResultRow*>> by_arch;
  std::vector<double> lrs;
  for (const v1::ResultRow& r : res->rows()) {
    rows.push_back(RowJson(r));
    by_arch[r.arch()].push_back(&r);
    for (const v1::LrLoss& l : r.lrs()) {
      if (std::find(lrs.begin(), lrs.end(), l.lr()) == lrs.end()) lrs.push_back(l.lr());
    }
  }
  std::sort(lrs.begin(), lrs.end());
  json figure = json::object();
  for (auto& [arch, members] : by_arch) {
    std::sort(members.begin(), members.end(), [](const auto* a, const auto* b) {
      return a->aspect_ratio() < b->aspect_ratio();
    });
    json series = json::array();
    for (const v1::ResultRow* r : members) {
      series.push_back(json{{"aspect_ratio", r->aspect_ratio()},
                            {"layers", r->layers()},
                            {"d_model", r->d_model()},
                            {"val_loss", Maybe(r->has_best(), r->best_val_loss())}});
    }
    figure[arch] = std::move(series);
  }
  return Json(200, json{{"sweep", name},
                        {"lrs", lrs},
                        {"rows", std::move(rows)},
                        {"loss_vs_aspect_ratio", std::move(figure)}});
}

WebResponse WebApi::SweepRuns(const WebRequest& request, const std::string& name) {
  v1::QueryResultsRequest req;
  req.set_sweep(name);
  absl::StatusOr<int64_t> page_size = IntParam(request, "page_size", 100, 1, 1000);
  if (!page_size.ok()) return FromStatus(page_size.status());
  req.set_page_size(static_cast<int32_t>(*page_size));
  req.set_page_token(Param(request, "page_token"));
  absl::StatusOr<v1::QueryResultsResponse> res = scheduler_->QueryResults(req);
  if (!res.ok()) return FromStatus(res.status());
  json runs = json::array();
  for (const v1::RunSummary& r : res->runs()) runs.push_back(RunJson(r));
  return Json(200, json{{"runs", std::move(runs)}, {"next_page_token", res->next_page_token()}});
}

WebResponse WebApi::ListJobsRoute(const WebRequest& request, const std::string&) {
  v1::ListJobsRequest req;
  req.set_sweep(Param(request, "sweep"));
  req.set_arch(Param(request, "arch"));
  const std::string state = Param(request, "state");
  if (!state.empty()) {
    absl::StatusOr<v1::JobState> s = storage::ParseJobState(state);
    if (!s.ok()) return Error(400, absl::StrCat("state: unknown job state \"", state, "\""));
    req.set_state(*s);
  }
  absl::StatusOr<int64_t> page_size = IntParam(request, "page_size", 100, 1, 1000);
  if (!page_size.ok()) return FromStatus(page_size.status());
  req.set_page_size(static_cast<int32_t>(*page_size));
  req.set_page_token(Param(request, "page_token"));
  absl::StatusOr<v1::ListJobsResponse> list = scheduler_->ListJobs(req);
  if (!list.ok()) return FromStatus(list.status());
  json jobs = json::array();
  for (const v1::Job& j : list->jobs()) jobs.push_back(JobJson(j, false));
  return Json(200, json{{"jobs", std::move(jobs)}, {"next_page_token", list->next_page_token()}});
}

// /api/jobs/ID, /api/jobs/ID/points, /api/jobs/ID/diagnostics.
WebResponse WebApi::JobRoute(const WebRequest& request, const std::string& path_rest) {
  int64_t id = 0;
  std::string tail;
  if (!SplitJobPath(path_rest, &id, &tail)) {
    return Error(400, absl::StrCat("job id: \"", path_rest, "\" is not a positive integer"));
  }
  if (tail.empty()) {
    absl::StatusOr<v1::Job> job = scheduler_->GetJob(id);
    if (!job.ok()) return FromStatus(job.status());
    return Json(200, JobJson(*job, true));

  }
  if (tail == "/points") return JobPoints(request, id);
  if (tail == "/diagnostics") return JobDiagnostics(id);
  return NoEndpoint(request.path);
}

WebResponse WebApi::JobPoints(const WebRequest& request, int64_t id) {
  absl::StatusOr<int64_t> since =
      IntParam(request, "since", 0, 0, std::numeric_limits<int64_t>::max());
  if (!since.ok()) return FromStatus(since.status());
  absl::StatusOr<int64_t> limit = IntParam(request, "limit", kMaxPointsPerRead, 1,
                                           kMaxPointsPerRead);
  if (!limit.ok()) return FromStatus(limit.status());
  absl::StatusOr<WatchBatch> batch = scheduler_->ReadWatch(id, *since, 0, *limit);
  if (!batch.ok()) return FromStatus(batch.status());
  // Columns per metric name: {"loss": {"step": [...], "value": [...]}}.
  const std::string names = Param(request, "names");
  std::vector<std::string> wanted;
  if (!names.empty()) wanted = absl::StrSplit(names, ',');
  json series = json::object();
  int64_t cursor = *since;
  for (const storage::MetricRecord& p : batch->points) {
    cursor = std::max(cursor, p.row_id);
    if (!wanted.empty() && std::find(wanted.begin(), wanted.end(), p.name) == wanted.end()) {
      continue;
    }
    json& s = series[p.name];
    if (s.is_null()) s = json{{"step", json::array()}, {"value", json::array()},
                              {"wall_ms", json::array()}};
    s["step"].push_back(p.step);
    s["value"].push_back(p.value);
    s["wall_ms"].push_back(p.wall_ms);
  }
  const bool more = static_cast<int64_t>(batch->points.size()) >= *limit;
  return Json(200, json{{"job_id", id},
                        {"state", storage::JobStateText(batch->state)},
                        {"series", std::move(series)},
                        {"next_since", cursor},
                        {"more", more}});
}

WebResponse WebApi::JobDiagnostics(int64_t id) {
  // A train job's diagnostics are those its group's results row holds
  // when the job is the group's diagnosis target; a diagnose job shows
  // those of the run it diagnosed.
  absl::StatusOr<v1::Job> job = scheduler_->GetJob(id);
  if (!job.ok()) return FromStatus(job.status());
  const int64_t target = job->kind() == v1::DIAGNOSE ? job->parent_job_id() : id;
  v1::QueryResultsRequest req;
  req.set_sweep(job->sweep_name());
  req.set_page_size(1);
  absl::StatusOr<v1::QueryResultsResponse> res = scheduler_->QueryResults(req);
  if (!res.ok()) return FromStatus(res.status());
  for (const v1::ResultRow& r : res->rows()) {
    if (r.arch() != job->arch() || r.layers() != job->layers() ||
        r.d_model() != job->d_model()) {
      continue;
    }
    if (r.diagnosed_job_id() != target) break;
    json data = json::parse(r.diagnostics_json(), nullptr, false);
    if (data.is_discarded()) data = json::object();
    return Json(200, json{{"job_id", id},
                          {"diagnosed_job_id", target},
                          {"summary", DiagnosticsSummary(r.diagnostics_json())},
                          {"data", std::move(data)}});
  }
  return Json(200, json{{"job_id", id}, {"diagnosed_job_id", nullptr},
                        {"summary", nullptr}, {"data", json::object()}});
}

}  // namespace depthbench::scheduler
