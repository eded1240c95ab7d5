#include "common/metrics_http_server.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "common/daemon_metrics.h"
#include "common/host_port.h"
#include "gtest/gtest.h"

namespace depthbench {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

struct Reply {
  int status = 0;
  std::string content_type;
  std::string body;
  std::string content_length;
};

// One request over a fresh loopback connection (a real socket).
Reply Fetch(uint16_t port, const std::string& target,
            http::verb method = http::verb::get) {
  net::io_context ioc;
  tcp::socket socket(ioc);
  socket.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
  http::request<http::empty_body> request(method, target, 11);
  request.set(http::field::host, "127.0.0.1");
  request.keep_alive(false);
  http::write(socket, request);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(64 * 1024 * 1024);
  if (method == http::verb::head) parser.skip(true);
  http::read(socket, buffer, parser);
  const auto& response = parser.get();
  Reply reply;
  reply.status = response.result_int();
  reply.content_type = std::string(response[http::field::content_type]);
  reply.content_length = std::string(response[http::field::content_length]);
  reply.body = response.body();
  return reply;
}

class MetricsHttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    counter_ = *registry_.AddCounter("test_requests_total", "Requests.",
                                     {"path"});
    counter_->WithLabelValues({"a\"b"}).Increment(3);
  }

  MetricsRegistry registry_;
  CounterFamily* counter_ = nullptr;
};

TEST_F(MetricsHttpServerTest, ServesEndpointsOnPortZero) {
  std::atomic<bool> ready{false};
  auto server = MetricsHttpServer::Start({}, &registry_, [&ready] {
    return ready.load() ? absl::OkStatus()
                        : absl::UnavailableError("database not migrated");
  });
  ASSERT_TRUE(server.ok()) << server.status();
  const uint16_t port = (*server)->port();
  ASSERT_NE(port, 0);
  EXPECT_EQ((*server)->bound_address().host, "127.0.0.1");
  EXPECT_EQ((*server)->bound_address().port, port);

  Reply metrics = Fetch(port, "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_EQ(metrics.content_type, "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(metrics.body, registry_.Render());
  EXPECT_NE(metrics.body.find("test_requests_total{path=\"a\\\"b\"} 3\n"),
            std::string::npos);

  // The scrape sees later updates.
  counter_->WithLabelValues({"a\"b"}).Increment();
  EXPECT_NE(Fetch(port, "/metrics?debug=1").body.find(
                "test_requests_total{path=\"a\\\"b\"} 4\n"),
            std::string::npos);

  Reply health = Fetch(port, "/healthz");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, "ok\n");

  Reply not_ready = Fetch(port, "/readyz");
  EXPECT_EQ(not_ready.status, 503);
  EXPECT_NE(not_ready.body.find("database not migrated"), std::string::npos);
  ready.store(true);
  Reply is_ready = Fetch(port, "/readyz");
  EXPECT_EQ(is_ready.status, 200);
  EXPECT_EQ(is_ready.body, "ready\n");

  EXPECT_EQ(Fetch(port, "/").status, 404);
  EXPECT_EQ(Fetch(port, "/metricsx").status, 404);
  EXPECT_EQ(Fetch(port, "/metrics", http::verb::post).status, 405);

  Reply head = Fetch(port, "/healthz", http::verb::head);
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.body, "");
  EXPECT_EQ(head.content_length, "3");
}

TEST_F(MetricsHttpServerTest, NoReadinessCheckMeansReady) {
  auto server = MetricsHttpServer::Start({}, &registry_);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(Fetch((*server)->port(), "/readyz").status, 200);
}

TEST_F(MetricsHttpServerTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  MetricsHttpServerOptions options;
  options.num_threads = 2;
  auto server = MetricsHttpServer::Start(options, &registry_);
  ASSERT_TRUE(server.ok()) << server.status();
  net::io_context ioc;
  tcp::socket socket(ioc);
  socket.connect(
      tcp::endpoint(net::ip::make_address("127.0.0.1"), (*server)->port()));
  beast::flat_buffer buffer;
  for (const char* target : {"/healthz", "/metrics", "/nope", "/readyz"}) {
    http::request<http::empty_body> request(http::verb::get, target, 11);
    request.set(http::field::host, "x");
    http::write(socket, request);
    http::response<http::string_body> response;
    http::read(socket, buffer, response);
    EXPECT_EQ(response.result_int(), std::string(target) == "/nope" ? 404 : 200)
        << target;
  }
}

TEST_F(MetricsHttpServerTest, ConcurrentScrapes) {
  MetricsHttpServerOptions options;
  options.num_threads = 2;
  auto server = MetricsHttpServer::Start(options, &registry_);
  ASSERT_TRUE(server.ok()) << server.status();
  const uint16_t port = (*server)->port();
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    clients.emplace_back([&] {
      for (int i = 0; i < 25; ++i) {
        counter_->WithLabelValues({"c"}).Increment();
        if (Fetch(port, "/metrics").status == 200) ok.fetch_add(1);
      }
    });
  }
  for (std::thread& c : clients) c.join();
  EXPECT_EQ(ok.load(), 100);
}

TEST_F(MetricsHttpServerTest, StopClosesTheListenerAndIsIdempotent) {
  auto server = MetricsHttpServer::Start({}, &registry_);
  ASSERT_TRUE(server.ok()) << server.status();
  const uint16_t port = (*server)->port();
  // An idle keep-alive connection must not block Stop().
  net::io_context ioc;
  tcp::socket idle(ioc);
  idle.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
  (*server)->Stop();
  (*server)->Stop();
  EXPECT_EQ((*server)->port(), port);
  tcp::socket late(ioc);
  beast::error_code ec;
  late.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port), ec);
  EXPECT_TRUE(ec) << "still accepting after Stop()";
  // The idle connection was closed by the server.
  char byte;
  idle.read_some(net::buffer(&byte, 1), ec);
  EXPECT_TRUE(ec);
}

// Idle clients cannot pile up descriptors: past max_connections the oldest
// connection is closed, and a scrape still gets through.
TEST_F(MetricsHttpServerTest, OldestConnectionsAreClosedPastTheCap) {
  MetricsHttpServerOptions options;
  options.max_connections = 4;
  auto server = MetricsHttpServer::Start(options, &registry_);
  ASSERT_TRUE(server.ok()) << server.status();
  const uint16_t port = (*server)->port();
  net::io_context ioc;
  std::vector<std::unique_ptr<tcp::socket>> idle;
  for (int i = 0; i < 12; ++i) {
    idle.push_back(std::make_unique<tcp::socket>(ioc));
    idle.back()->connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    // Accepted in this order (the cap evicts by acceptance).
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Reply reply = Fetch(port, "/healthz");
  EXPECT_EQ(reply.status, 200);
  // The first eight were closed by the server (EOF / reset on read).
  int closed = 0;
  for (int i = 0; i < 12; ++i) {
    beast::error_code ec;
    idle[i]->non_blocking(true);
    char byte;
    for (int tries = 0; tries < 100; ++tries) {
      idle[i]->read_some(net::buffer(&byte, 1), ec);
      if (ec != net::error::would_block) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (ec && ec != net::error::would_block) ++closed;
    if (i < 8) {
      EXPECT_TRUE(ec && ec != net::error::would_block) << "connection " << i;
    }
  }
  EXPECT_GE(closed, 8);
  EXPECT_LE(closed, 9);  // the newest four stay open (the scrape's was one)
}

TEST_F(MetricsHttpServerTest, ZeroMaxConnectionsIsInvalid) {
  MetricsHttpServerOptions options;
  options.max_connections = 0;
  EXPECT_EQ(MetricsHttpServer::Start(options, &registry_).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(MetricsHttpServerTest, BindErrors) {
  MetricsHttpServerOptions options;
  options.listen = "127.0.0.1";
  EXPECT_EQ(MetricsHttpServer::Start(options, &registry_).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.listen = "127.0.0.1:0";
  options.num_threads = 0;
  EXPECT_EQ(MetricsHttpServer::Start(options, &registry_).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MetricsHttpServer::Start({}, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Port already in use.
  auto first = MetricsHttpServer::Start({}, &registry_);
  ASSERT_TRUE(first.ok());
  options = {};
  options.listen = (*first)->bound_address().ToString();
  EXPECT_EQ(MetricsHttpServer::Start(options, &registry_).status().code(),
            absl::StatusCode::kUnavailable);
  options.listen = "no-such-host.invalid:0";
  EXPECT_EQ(MetricsHttpServer::Start(options, &registry_).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(MetricsHttpServerTest, BindsIpv6LoopbackWhenAvailable) {
  MetricsHttpServerOptions options;
  options.listen = "[::1]:0";
  auto server = MetricsHttpServer::Start(options, &registry_);
  if (!server.ok()) GTEST_SKIP() << "no IPv6 loopback: " << server.status();
  EXPECT_EQ((*server)->bound_address().host, "::1");
  EXPECT_EQ((*server)->bound_address().ToString(),
            "[::1]:" + std::to_string((*server)->port()));
}

TEST(HostPortTest, Parses) {
  struct Case {
    std::string text;
    bool ok;
    std::string host;
    uint16_t port;
  };
  const std::vector<Case> cases = {
      {"127.0.0.1:9100", true, "127.0.0.1", 9100},
      {"localhost:0", true, "localhost", 0},
      {":7070", true, "0.0.0.0", 7070},
      {"[::1]:65535", true, "::1", 65535},
      {"[::]:1", true, "::", 1},
      {"host", false, "", 0},
      {"host:", false, "", 0},
      {"host:65536", false, "", 0},
      {"host:12a", false, "", 0},
      {"::1:80", false, "", 0},
      {"[::1]80", false, "", 0},
      {"[::1", false, "", 0},
  };
  for (const Case& c : cases) {
    absl::StatusOr<HostPort> hp = ParseHostPort(c.text);
    EXPECT_EQ(hp.ok(), c.ok) << c.text;
    if (!hp.ok() || !c.ok) continue;
    EXPECT_EQ(hp->host, c.host) << c.text;
    EXPECT_EQ(hp->port, c.port) << c.text;
  }
  EXPECT_EQ((HostPort{"10.0.0.1", 80}).ToString(), "10.0.0.1:80");
}

// --- promtool check metrics on both daemons' real endpoints ---------------

constexpr char kPromtool[] = "/usr/bin/promtool";

bool PromtoolInstalled() { return access(kPromtool, X_OK) == 0; }

// Runs `promtool check metrics` on `exposition`; returns its exit code and
// puts its output into *output.
int PromtoolCheckMetrics(const std::string& exposition, std::string* output) {
  char dir_template[] = "/tmp/db_promtool_XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (dir == nullptr) return -1;
  const std::string in = std::string(dir) + "/metrics.txt";
  const std::string out = std::string(dir) + "/out.txt";
  std::ofstream(in) << exposition;
  const std::string cmd = std::string(kPromtool) + " check metrics < " + in +
                          " > " + out + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream result(out);
  output->assign(std::istreambuf_iterator<char>(result), {});
  std::remove(in.c_str());
  std::remove(out.c_str());
  rmdir(dir);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// Serves `registry` on /metrics and checks the exposition with promtool
// (no errors, no lint warnings).
void ExpectServedMetricsPassPromtool(MetricsRegistry& registry) {
  auto server = MetricsHttpServer::Start({}, &registry);
  ASSERT_TRUE(server.ok()) << server.status();
  const Reply reply = Fetch((*server)->port(), "/metrics");
  ASSERT_EQ(reply.status, 200);
  std::string output;
  EXPECT_EQ(PromtoolCheckMetrics(reply.body, &output), 0) << output;
  EXPECT_EQ(output, "") << output;
}

TEST(PromtoolCheckMetricsTest, SchedulerEndpointPasses) {
  if (!PromtoolInstalled()) GTEST_SKIP() << "promtool not installed";
  MetricsRegistry registry;
  auto m = RegisterSchedulerMetrics(
      &registry, "0.1.0",
      []() -> absl::StatusOr<std::vector<CollectedSample>> {
        return std::vector<CollectedSample>{{{"demo", "running"}, 2},
                                            {{"demo", "pending"}, 7},
                                            {{"demo \"quoted\"", "failed"}, 1}};
      });
  ASSERT_TRUE(m.ok()) << m.status();
  m->RecordRpc("AcquireJob", "OK", 0.001);
  m->RecordRpc("ReportMetrics", "UNAVAILABLE", 2.5);
  m->jobs_finished->WithLabelValues({"succeeded"}).Increment();
  m->job_retries->WithLabelValues({"lease_expired"}).Increment();
  m->sqlite_transaction_duration->WithLabelValues({"finish_job"}).Observe(3e-4);
  m->workers_connected->Set(2);
  ExpectServedMetricsPassPromtool(registry);
}

TEST(PromtoolCheckMetricsTest, WorkerEndpointPasses) {
  if (!PromtoolInstalled()) GTEST_SKIP() << "promtool not installed";
  MetricsRegistry registry;
  auto m = RegisterWorkerMetrics(&registry, "0.1.0", [] { return 1.5; });
  ASSERT_TRUE(m.ok()) << m.status();
  m->SetSlots(2, 0);
  m->RecordStep({"j1", "demo", "hc"}, 10, 5.5, 1234.5);
  m->RecordEval({"j1", "demo", "hc"}, 5.75);
  m->RecordStep({"j2", "demo", "attnres_full"}, 3, 7.25, 999);
  m->child_restarts->Increment();
  m->relay_backlog_points->Set(12);
  ExpectServedMetricsPassPromtool(registry);
}

TEST(PromtoolCheckMetricsTest, PromtoolRejectsABrokenExposition) {
  // Guards the two tests above against a promtool that accepts anything.
  if (!PromtoolInstalled()) GTEST_SKIP() << "promtool not installed";
  std::string output;
  EXPECT_NE(PromtoolCheckMetrics("bad{le=\"x\" 1\n", &output), 0);
  EXPECT_NE(PromtoolCheckMetrics("# TYPE x counter\nx 1\n", &output), 0)
      << "lint: counter without _total, no HELP";
}

}  // namespace
}  // namespace depthbench
