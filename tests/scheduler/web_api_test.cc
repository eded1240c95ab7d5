// WebApi (scheduler/web_api.h) over a real Scheduler on a temp SQLite file
// with a FakeClock: the token rule, precise errors for bad parameters, the
// points cursor, paging, results aggregation, the ETA from recent
// throughput and the progress cache. The pages themselves are tested in
// headless Chromium (tests/integration/web_view_e2e_test.cc). Also the
// HTTP transport (web_server.h): decoding, HEAD, refused methods and bodies.
#include "scheduler/web_api.h"

#include <map>
#include <set>
#include <string>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "scheduler/scheduler.h"
#include "scheduler/web_server.h"
#include "tests/scheduler/test_util.h"

namespace depthbench::scheduler {
namespace {

namespace v1 = ::depthbench::v1;
using json = nlohmann::json;
using depthbench::testing::AcquireFor;
using depthbench::testing::RegisterWorker;
using depthbench::testing::SmallSpec;
using depthbench::testing::TempDb;

class WebApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = Scheduler::Open(TempDb(std::string("web_") +
                                    ::testing::UnitTest::GetInstance()->current_test_info()->name()),
                             &clock_);
    ASSERT_TRUE(s.ok()) << s.status();
    scheduler_ = std::move(*s);
  }

  WebResponse Get(WebApi& api, const std::string& path,
                  std::map<std::string, std::string> query = {},
                  const std::string& authorization = "") {
    WebRequest r;
    r.method = "GET";
    r.path = path;
    r.query = std::move(query);
    r.authorization = authorization;
    return api.Handle(r);
  }

  json GetJson(WebApi& api, const std::string& path, std::map<std::string, std::string> query = {}) {
    WebResponse r = Get(api, path, std::move(query));
    EXPECT_EQ(r.status, 200) << path << ": " << r.body;
    EXPECT_EQ(r.content_type, "application/json");
    return json::parse(r.body);
  }

  void Submit(const v1::SweepSpec& spec) {
    auto r = scheduler_->SubmitSweep(spec);
    ASSERT_TRUE(r.ok()) << r.status();
  }

  void Report(const v1::AcquireJobResponse& lease, int64_t from_step, int n) {
    v1::ReportMetricsRequest req;
    req.set_job_id(lease.job_id());
    req.set_attempt_id(lease.attempt_id());
    for (int i = 0; i < n; ++i) {
      v1::MetricPoint* p = req.add_points();
      p->set_step(from_step + i);
      p->set_name(i % 2 == 0 ? "loss" : "lr");
      p->set_value(3.0 - 0.1 * (from_step + i));
      p->set_wall_ms(1);
    }
    auto r = scheduler_->ReportMetrics(req);
    ASSERT_TRUE(r.ok()) << r.status();
  }

  void Finish(const v1::AcquireJobResponse& lease, double val_loss) {
    v1::FinishJobRequest req;
    req.set_job_id(lease.job_id());
    req.set_attempt_id(lease.attempt_id());
    req.set_status(v1::FINISH_SUCCEEDED);
    req.set_has_val_loss(true);
    req.set_final_val_loss(val_loss);
    req.set_final_step(10);
    auto r = scheduler_->FinishJob(req);
    ASSERT_TRUE(r.ok()) << r.status();
  }

  FakeClock clock_;
  std::unique_ptr<Scheduler> scheduler_;
};

TEST_F(WebApiTest, ApiNeedsTheTokenThePageShellDoesNot) {
  WebApi api(scheduler_.get(), &clock_, "s3cret");
  WebResponse missing = Get(api, "/api/sweeps");
  EXPECT_EQ(missing.status, 401);
  EXPECT_NE(missing.body.find("token is required"), std::string::npos);
  bool challenged = false;
  for (const auto& [k, v] : missing.headers) challenged |= k == "WWW-Authenticate";
  EXPECT_TRUE(challenged);
  EXPECT_EQ(Get(api, "/api/sweeps", {}, "Bearer wrong").status, 401);
  EXPECT_EQ(Get(api, "/api/sweeps", {}, "Bearer s3cre").status, 401);   // a prefix
  EXPECT_EQ(Get(api, "/api/sweeps", {}, "Bearer s3cret!").status, 401);  // longer
  EXPECT_EQ(Get(api, "/api/sweeps", {}, "s3cret").status, 401);          // no scheme
  EXPECT_EQ(Get(api, "/api/jobs/1", {}, "").status, 401);  // before the job is looked up
  EXPECT_EQ(Get(api, "/api/sweeps", {}, "Bearer s3cret").status, 200);

  WebResponse shell = Get(api, "/");
  EXPECT_EQ(shell.status, 200);
  EXPECT_EQ(shell.content_type, "text/html; charset=utf-8");
  EXPECT_NE(shell.body.find("login-form"), std::string::npos);
  bool csp = false;
  for (const auto& [k, v] : shell.headers) {
    if (k == "Content-Security-Policy") csp = v.find("default-src 'self'") != std::string::npos;
  }
  EXPECT_TRUE(csp);
  WebResponse uplot = Get(api, "/static/uPlot.iife.min.js");
  EXPECT_EQ(uplot.status, 200);
  EXPECT_EQ(uplot.content_type, "text/javascript; charset=utf-8");
  EXPECT_GT(uplot.body.size(), 10000u);
  EXPECT_NE(Get(api, "/static/LICENSE").body.find("MIT"), std::string::npos);
  EXPECT_EQ(Get(api, "/static/nope.js").status, 404);
  EXPECT_EQ(Get(api, "/static/../web_api.cc").status, 404);
}

TEST_F(WebApiTest, BadParametersAreNamed) {
  WebApi api(scheduler_.get(), &clock_, "");
  Submit(SmallSpec("s", {"pre_ln"}, {1e-3}));
  auto expect = [&](const std::string& path, std::map<std::string, std::string> q, int status,
                    const std::string& says) {
    WebResponse r = Get(api, path, q);
    EXPECT_EQ(r.status, status) << path << " " << r.body;
    EXPECT_NE(json::parse(r.body)["error"].get<std::string>().find(says), std::string::npos)
        << path << ": " << r.body;
  };
  expect("/api/sweeps", {{"page_size", "0"}}, 400, "page_size");
  expect("/api/sweeps", {{"page_size", "ten"}}, 400, "page_size");
  expect("/api/jobs", {{"state", "bogus"}}, 400, "state");
  expect("/api/jobs", {{"page_size", "1001"}}, 400, "page_size");
  expect("/api/jobs", {{"page_token", "garbage"}}, 400, "page_token");
  expect("/api/jobs/abc", {}, 400, "job id");
  expect("/api/jobs/0", {}, 400, "job id");
  expect("/api/jobs/999", {}, 404, "999");
  expect("/api/jobs/1/points", {{"since", "-1"}}, 400, "since");
  expect("/api/jobs/1/points", {{"limit", "0"}}, 400, "limit");
  expect("/api/sweeps/nope", {}, 404, "nope");
  expect("/api/sweeps/nope/results", {}, 404, "nope");
  expect("/api/nothing", {}, 404, "docs/WEB.md");
}

TEST_F(WebApiTest, PointsCursorReturnsOnlyNewPoints) {
  WebApi api(scheduler_.get(), &clock_, "");
  Submit(SmallSpec("s", {"pre_ln"}, {1e-3}));
  RegisterWorker(*scheduler_, "w");
  v1::AcquireJobResponse lease = AcquireFor(*scheduler_, "w");
  ASSERT_GT(lease.job_id(), 0);
  Report(lease, 1, 4);  // loss at 1, 3; lr at 2, 4
  const std::string path = "/api/jobs/" + std::to_string(lease.job_id()) + "/points";
  json first = GetJson(api, path, {{"names", "loss"}});
  EXPECT_EQ(first["state"], "running");
  EXPECT_EQ(first["series"]["loss"]["step"], json({1, 3}));
  EXPECT_FALSE(first["series"].contains("lr"));
  EXPECT_EQ(first["more"], false);
  const int64_t since = first["next_since"];
  EXPECT_GT(since, 0);
  // Nothing new: nothing returned, the cursor stays.
  json none = GetJson(api, path, {{"since", std::to_string(since)}});
  EXPECT_TRUE(none["series"].empty());
  EXPECT_EQ(none["next_since"], since);
  Report(lease, 5, 2);
  json next = GetJson(api, path, {{"since", std::to_string(since)}});
  EXPECT_EQ(next["series"]["loss"]["step"], json({5}));
  EXPECT_EQ(next["series"]["lr"]["step"], json({6}));
  // A limit pages the history: `more` until it is read.
  json page = GetJson(api, path, {{"limit", "2"}});
  EXPECT_EQ(page["more"], true);
  json rest = GetJson(api, path, {{"since", std::to_string(page["next_since"].get<int64_t>())}});
  EXPECT_EQ(rest["series"]["loss"]["step"].size() + page["series"]["loss"]["step"].size(), 3u);
}

TEST_F(WebApiTest, ResultsRunsAndJobsFollowTheSweep) {
  WebApi api(scheduler_.get(), &clock_, "");
  Submit(SmallSpec("s", {"pre_ln", "hc"}, {1e-3, 1e-2}));
  RegisterWorker(*scheduler_, "w", 8);
  // Finish both pre_ln runs: its group completes with a best LR.
  for (int i = 0; i < 4; ++i) {
    v1::AcquireJobResponse lease = AcquireFor(*scheduler_, "w");
    ASSERT_GT(lease.job_id(), 0);
    auto job = scheduler_->GetJob(lease.job_id());
    ASSERT_TRUE(job.ok());
    if (job->arch() == "pre_ln") Finish(lease, job->lr() < 5e-3 ? 2.5 : 2.0);
  }
  json res = GetJson(api, "/api/sweeps/s/results");
  ASSERT_EQ(res["rows"].size(), 2u);
  EXPECT_EQ(res["lrs"], json({1e-3, 1e-2}));
  for (const json& row : res["rows"]) {
    if (row["arch"] == "pre_ln") {
      EXPECT_EQ(row["complete"], true);
      EXPECT_DOUBLE_EQ(row["best_lr"].get<double>(), 1e-2);
      EXPECT_DOUBLE_EQ(row["best_val_loss"].get<double>(), 2.0);
      EXPECT_EQ(row["lrs"].size(), 2u);
    } else {
      EXPECT_EQ(row["complete"], false);
      EXPECT_TRUE(row["best_lr"].is_null());
    }
  }
  // Figure 2: a series per design; hc has no finished run yet.
  EXPECT_EQ(res["loss_vs_aspect_ratio"]["pre_ln"].size(), 1u);
  EXPECT_DOUBLE_EQ(res["loss_vs_aspect_ratio"]["pre_ln"][0]["val_loss"].get<double>(), 2.0);
  EXPECT_TRUE(res["loss_vs_aspect_ratio"]["hc"][0]["val_loss"].is_null());

  // Runs, one a page, followed by their tokens.
  std::set<int64_t> seen;
  std::string token;
  for (int i = 0; i < 10; ++i) {
    std::map<std::string, std::string> q = {{"page_size", "1"}};
    if (!token.empty()) q["page_token"] = token;
    json page = GetJson(api, "/api/sweeps/s/runs", q);
    for (const json& r : page["runs"]) seen.insert(r["job_id"].get<int64_t>());
    token = page["next_page_token"];
    if (token.empty()) break;
  }
  EXPECT_EQ(seen.size(), 4u);

  json running = GetJson(api, "/api/jobs", {{"sweep", "s"}, {"state", "running"}});
  json leased = GetJson(api, "/api/jobs", {{"sweep", "s"}, {"state", "leased"}});
  EXPECT_EQ(running["jobs"].size() + leased["jobs"].size(), 2u);
  json succeeded = GetJson(api, "/api/jobs", {{"sweep", "s"}, {"state", "succeeded"}});
  ASSERT_EQ(succeeded["jobs"].size(), 2u);
  const int64_t id = succeeded["jobs"][0]["id"];
  json job = GetJson(api, "/api/jobs/" + std::to_string(id));
  EXPECT_EQ(job["state"], "succeeded");
  ASSERT_EQ(job["attempts"].size(), 1u);
  EXPECT_EQ(job["attempts"][0]["outcome"], "succeeded");
  EXPECT_FALSE(job["attempts"][0]["worker_id"].get<std::string>().empty());
  EXPECT_TRUE(job["config"].is_object());
  // Not diagnosed: no data.
  json diag = GetJson(api, "/api/jobs/" + std::to_string(id) + "/diagnostics");
  EXPECT_TRUE(diag["diagnosed_job_id"].is_null());
}

TEST_F(WebApiTest, ReasonsThatAreNotUtf8StillAnswer) {
  WebApi api(scheduler_.get(), &clock_, "");
  Submit(SmallSpec("s", {"pre_ln"}, {1e-3}));
  RegisterWorker(*scheduler_, "w");
  v1::AcquireJobResponse lease = AcquireFor(*scheduler_, "w");
  v1::FinishJobRequest fail;
  fail.set_job_id(lease.job_id());
  fail.set_attempt_id(lease.attempt_id());
  fail.set_status(v1::FINISH_FAILED);
  fail.set_reason("stderr tail: \xff\xfe bad bytes");
  ASSERT_TRUE(scheduler_->FinishJob(fail).ok());
  WebResponse r = Get(api, "/api/jobs/" + std::to_string(lease.job_id()));
  ASSERT_EQ(r.status, 200) << r.body;
  json job = json::parse(r.body);
  ASSERT_EQ(job["attempts"].size(), 1u);
  EXPECT_EQ(job["attempts"][0]["reason"], "stderr tail: \xEF\xBF\xBD\xEF\xBF\xBD bad bytes");
}

TEST_F(WebApiTest, EtaFollowsRecentThroughputAndProgressIsCachedBriefly) {
  WebApi api(scheduler_.get(), &clock_, "");
  Submit(SmallSpec("s", {"pre_ln", "hc"}, {1e-3, 1e-2, 1e-1}));  // 6 jobs
  RegisterWorker(*scheduler_, "w", 8);
  json first = GetJson(api, "/api/sweeps");
  ASSERT_EQ(first["sweeps"].size(), 1u);
  EXPECT_EQ(first["sweeps"][0]["total_jobs"], 6);
  EXPECT_TRUE(first["sweeps"][0]["eta_s"].is_null());  // nothing finished, no age yet

  clock_.AdvanceMs(10'000);
  for (int i = 0; i < 2; ++i) Finish(AcquireFor(*scheduler_, "w"), 2.0);
  json second = GetJson(api, "/api/sweeps");
  const json& s = second["sweeps"][0];
  EXPECT_EQ(s["done_jobs"], 2);
  EXPECT_EQ(s["job_counts"]["succeeded"], 2);
  // 2 jobs in the 10 s between the two samples: 12 jobs/min, 4 left: 20 s.
  EXPECT_NEAR(s["jobs_per_minute"].get<double>(), 12.0, 1e-9);
  EXPECT_NEAR(s["eta_s"].get<double>(), 20.0, 1e-9);

  // Within kProgressCacheMs the same answer is shared...
  Finish(AcquireFor(*scheduler_, "w"), 2.0);
  EXPECT_EQ(GetJson(api, "/api/sweeps")["sweeps"][0]["done_jobs"], 2);
  EXPECT_EQ(GetJson(api, "/api/sweeps/s")["done_jobs"], 3);  // first read of this key
  // ...after it, the new count shows.
  clock_.AdvanceMs(WebApi::kProgressCacheMs);
  EXPECT_EQ(GetJson(api, "/api/sweeps")["sweeps"][0]["done_jobs"], 3);
  json one = GetJson(api, "/api/sweeps/s");
  EXPECT_EQ(one["spec"]["name"], "s");
  EXPECT_EQ(one["state"], "running");
}

}  // namespace
}  // namespace depthbench::scheduler

namespace depthbench::scheduler {
namespace {

// The transport (web_server.h) with a handler that echoes what it was given.
class WebServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WebServerOptions options;
    auto started = WebServer::Start(options, [](const WebRequest& r) {
      WebResponse out;
      json q = json::object();
      for (const auto& [k, v] : r.query) q[k] = v;
      out.body = json{{"method", r.method}, {"path", r.path}, {"query", q},
                      {"authorization", r.authorization}}
                     .dump();
      return out;
    });
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = std::move(*started);
  }

  // One raw HTTP/1.1 exchange over a fresh connection; the whole answer.
  std::string Raw(const std::string& request) {
    namespace net = boost::asio;
    net::io_context ioc;
    net::ip::tcp::socket socket(ioc);
    socket.connect({net::ip::make_address("127.0.0.1"), server_->port()});
    net::write(socket, net::buffer(request));
    std::string out;
    boost::system::error_code ec;
    char buf[4096];
    while (true) {
      size_t n = socket.read_some(net::buffer(buf), ec);
      out.append(buf, n);
      if (ec) break;
    }
    return out;
  }

  std::unique_ptr<WebServer> server_;
};

TEST_F(WebServerTest, DecodesTargetsAndRefusesWhatIsNotARead) {
  EXPECT_EQ(server_->url(), "http://127.0.0.1:" + std::to_string(server_->port()) + "/");
  EXPECT_FALSE(server_->tls());
  std::string ok = Raw(
      "GET /api/sweeps/a%20b?x=1&y=%2Fz&flag HTTP/1.1\r\nHost: h\r\n"
      "Authorization: Bearer t\r\nConnection: close\r\n\r\n");
  ASSERT_NE(ok.find("HTTP/1.1 200 OK"), std::string::npos) << ok;
  json body = json::parse(ok.substr(ok.find("\r\n\r\n") + 4));
  EXPECT_EQ(body["path"], "/api/sweeps/a b");
  EXPECT_EQ(body["query"], json({{"x", "1"}, {"y", "/z"}, {"flag", ""}}));
  EXPECT_EQ(body["authorization"], "Bearer t");
  EXPECT_EQ(body["method"], "GET");

  std::string head = Raw("HEAD /x HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
  EXPECT_NE(head.find("HTTP/1.1 200 OK"), std::string::npos) << head;
  EXPECT_NE(head.find("Content-Length: "), std::string::npos);
  EXPECT_EQ(head.substr(head.find("\r\n\r\n") + 4), "");  // no body

  std::string post = Raw("POST /api/sweeps HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n"
                         "Connection: close\r\n\r\n");
  EXPECT_NE(post.find("HTTP/1.1 405"), std::string::npos) << post;
  EXPECT_NE(post.find("Allow: GET, HEAD"), std::string::npos);

  std::string bad = Raw("GET /api/%zz HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
  EXPECT_NE(bad.find("HTTP/1.1 400"), std::string::npos) << bad;
  EXPECT_NE(bad.find("percent-escape"), std::string::npos);
  std::string cut = Raw("GET /api/x%4 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
  EXPECT_NE(cut.find("HTTP/1.1 400"), std::string::npos) << cut;

  // A request body is refused: the connection closes without an answer.
  std::string with_body = Raw("GET /x HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello");
  EXPECT_EQ(with_body.find("HTTP/1.1 200"), std::string::npos) << with_body;
}

TEST(WebServerOptionsTest, BadOptionsAreNamed) {
  auto echo = [](const WebRequest&) { return WebResponse(); };
  WebServerOptions o;
  o.tls_cert_pem = "x";
  auto half = WebServer::Start(o, echo);
  EXPECT_EQ(half.status().code(), absl::StatusCode::kInvalidArgument);
  o.tls_key_pem = "y";
  auto garbage = WebServer::Start(o, echo);
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(garbage.status().message().find("tls_cert_pem"), std::string::npos)
      << garbage.status();
  WebServerOptions bad_listen;
  bad_listen.listen = "nowhere";
  EXPECT_FALSE(WebServer::Start(bad_listen, echo).ok());
}

}  // namespace
}  // namespace depthbench::scheduler
