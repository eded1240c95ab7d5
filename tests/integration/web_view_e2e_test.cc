// The scheduler's web view end to end (issue 16): the real
// depthbench-scheduler (--web-listen, --auth-token-file), two real
// depthbench-workers running a small sweep through a scripted trainer
// (testdata/webview_trainer.py: one slow run, a divergence, a crash that is
// retried, diagnostics), the real CLI submitting it, and Debian's headless
// Chromium driven over the DevTools protocol. It checks what a user sees:
// a missing or wrong token gets the login form and no data; the sweeps page
// lists the sweep; a loss curve gains points while its run trains; the
// results table fills in as runs finish; a job shows its attempts and
// diagnostics heatmaps. Screenshots of each page go to
// $DEPTHBENCH_WEB_SCREENSHOTS (default: the test's temp dir) and are copied
// to build/web-screenshots/.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/integration/cdp_client.h"
#include "tests/integration/scheduler_process.h"
#include "tests/integration/worker_process.h"

namespace depthbench::testing {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr char kToken[] = "web-view-e2e-token";
constexpr char kSweep[] = "webtest";

// 2 designs x 3 shapes x 2 LRs = 12 train runs, then 6 diagnose jobs.
constexpr char kSpec[] = R"(name: webtest
architectures: [pre_ln, hc]
shapes:
  suite: tiny
lr_grids:
  pre_ln: [3.0e-3, 1.0e-2]
  hc: [3.0e-3, 1.0e-2]
seeds: [0]
training:
  data: brown
  seq_len: 64
  batch: 8
  steps: 50
  eval_batches: 1
  checkpoint_interval: 50
  log_interval: 1
diagnostics:
  kinds: [angular, causal, permutation, deff]
retry:
  max_attempts: 2
  initial_backoff_ms: 200
)";

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int ReadPort(const std::string& path) {
  for (int i = 0; i < 500; ++i) {
    std::ifstream in(path);
    int port = 0;
    if (in >> port && port > 0) return port;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return 0;
}

class WebViewE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("webview");
    const char* env = std::getenv("DEPTHBENCH_WEB_SCREENSHOTS");
    shots_ = env != nullptr && *env != '\0' ? std::string(env) : dir_ + "/screenshots";
    fs::create_directories(shots_);
    token_file_ = dir_ + "/token";
    std::ofstream(token_file_) << kToken << "\n";
  }

  void TearDown() override {
    // Copies of the screenshots where people look for them.
    std::error_code ec;
    const fs::path copy = fs::path(DEPTHBENCH_BUILD_DIR) / "web-screenshots";
    fs::create_directories(copy, ec);
    for (const auto& entry : fs::directory_iterator(shots_, ec)) {
      fs::copy_file(entry.path(), copy / entry.path().filename(),
                    fs::copy_options::overwrite_existing, ec);
    }
    if (!HasFailure()) fs::remove_all(dir_, ec);
  }

  // A screenshot of the page, which must have thrown no error so far.
  void Shot(Chromium& browser, const std::string& name) {
    EXPECT_TRUE(browser.Screenshot(shots_ + "/" + name + ".png")) << name;
    EXPECT_EQ(browser.PageErrors(), nlohmann::json::array()) << name;
  }

  // The endpoints themselves: no data without the right token; the page
  // shell (no data) is public: it is the login form.
  void ExpectEndpointsNeedTheToken(int web) {
    EXPECT_EQ(HttpGet(web, "/api/sweeps").status, 401);
    EXPECT_EQ(HttpGet(web, "/api/sweeps", "Bearer wrong-token").status, 401);
    EXPECT_EQ(HttpGet(web, "/api/sweeps", bearer_).status, 200);
    HttpResult shell = HttpGet(web, "/");
    EXPECT_EQ(shell.status, 200);
    EXPECT_NE(shell.body.find("login-form"), std::string::npos);
    EXPECT_EQ(HttpGet(web, "/static/uPlot.iife.min.js").status, 200);
    EXPECT_EQ(HttpGet(web, "/api/jobs?page_size=x", bearer_).status, 400);
    EXPECT_NE(HttpGet(web, "/api/jobs?page_size=x", bearer_).body.find("page_size"),
              std::string::npos);
  }

  void SubmitSweep(const SchedulerProcess& scheduler) {
    const std::string spec = dir_ + "/spec.yaml";
    std::ofstream(spec) << kSpec;
    auto [rc, out] = RunCommand(std::string(DEPTHBENCH_CLI_BIN) + " --scheduler " +
                                scheduler.address() + " --token-file " + token_file_ +
                                " submit " + spec + " 2>&1");
    ASSERT_EQ(rc, 0) << out;
  }

  // No token, then a wrong one: the login form and no data; then signing in
  // through the form: the sweeps page lists the sweep.
  void LogIn(Chromium& browser, const std::string& base) {
    ASSERT_TRUE(browser.Navigate(base));
    ASSERT_TRUE(browser.WaitFor("!document.querySelector('#login').hidden", 10000))
        << "no login form without a token";
    EXPECT_EQ(browser.Eval("document.querySelector('#view').children.length"), 0);
    EXPECT_EQ(browser.Eval("document.body.innerText.includes('webtest')"), false);
    Shot(browser, "01-login");

    browser.Eval("sessionStorage.setItem('depthbench-token', 'wrong-token'); location.reload()");
    ASSERT_TRUE(browser.WaitFor("document.readyState === 'complete' && "
                                "!document.querySelector('#login').hidden && "
                                "!document.querySelector('#login-error').hidden",
                                10000))
        << "no login form with a wrong token";
    EXPECT_EQ(browser.Eval("document.body.innerText.includes('webtest')"), false);
    EXPECT_EQ(browser.Eval("document.querySelectorAll('table').length"), 0);
    Shot(browser, "02-wrong-token");

    browser.Eval(std::string("document.querySelector('#token').value = '") + kToken +
                 "'; document.querySelector('#login-form').requestSubmit()");
    ASSERT_TRUE(browser.WaitFor(
        "document.querySelector('#sweeps-table') && "
        "[...document.querySelectorAll('#sweeps-table a')].some(a => a.textContent === 'webtest')",
        10000))
        << "the sweeps page does not list the sweep";
    EXPECT_TRUE(browser.Eval("document.querySelector('#login').hidden").get<bool>());
    Shot(browser, "03-sweeps");
  }

  // The slow run (pre_ln, L=2, lr 3e-3; 50 steps of 0.3 s) once it runs; 0
  // if it never does.
  int64_t WaitForSlowRun(int web) {
    for (int i = 0; i < 200; ++i) {
      json jobs = json::parse(
          HttpGet(web, "/api/jobs?sweep=webtest&state=running", bearer_).body, nullptr, false);
      if (jobs.is_object()) {
        for (const json& j : jobs["jobs"]) {
          if (j["arch"] == "pre_ln" && j["layers"] == 2 && j["lr"].get<double>() < 5e-3) {
            return j["id"];
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return 0;
  }

  // A loss curve gains points while its run trains.
  void ExpectLiveCurve(Chromium& browser, const std::string& base, int web) {
    const int64_t slow_id = WaitForSlowRun(web);
    ASSERT_GT(slow_id, 0) << "the slow run never ran";
    ASSERT_TRUE(browser.Navigate(base + "#/job/" + std::to_string(slow_id)));
    ASSERT_TRUE(browser.WaitFor(
        "Number(document.querySelector('#job-chart')?.dataset.points) >= 2", 10000));
    const int first = browser.Eval("Number(document.querySelector('#job-chart').dataset.points)");
    ASSERT_TRUE(browser.WaitFor("Number(document.querySelector('#job-chart').dataset.points) > " +
                                    std::to_string(first),
                                10000))
        << "the curve did not grow";
    const int later = browser.Eval("Number(document.querySelector('#job-chart').dataset.points)");
    EXPECT_EQ(browser.Eval("document.querySelector('#job-chart').dataset.state"), "running")
        << "the run should still be training when its curve grows";
    EXPECT_GT(later, first);
    EXPECT_EQ(browser.Eval("document.querySelectorAll('#job-chart canvas').length > 0"), true);
    Shot(browser, "04-job-live-curve");
  }

  // The results table fills in as runs finish. Done: every LR cell has a
  // loss or a mark, each group its best LR highlighted, diagnostics
  // summaries in, the sweep completed.
  void ExpectResultsFillIn(Chromium& browser, const std::string& base, int web) {
    ASSERT_TRUE(browser.Navigate(base + "#/sweep/webtest"));
    const std::string filled =
        "[...document.querySelectorAll('#results-table td.lr')].filter(td => "
        "td.textContent.trim() !== '\\u2026').length";
    ASSERT_TRUE(browser.WaitFor(
        "document.querySelectorAll('#results-table tbody tr').length === 6", 10000));
    const int filled_early = browser.Eval(filled);
    json sweep_early = json::parse(HttpGet(web, "/api/sweeps/webtest", bearer_).body);
    EXPECT_EQ(sweep_early["state"], "running");
    EXPECT_LT(filled_early, 12) << "every cell filled before the slow run ended";
    Shot(browser, "05-sweep-running");
    ASSERT_TRUE(browser.WaitFor(filled + " === 12 && "
                                "document.querySelectorAll('#results-table td.best').length === 6 && "
                                "document.querySelector('#sweep-summary').textContent.includes('completed') && "
                                "(() => { const ths = [...document.querySelectorAll('#results-table th')];"
                                "const i = ths.findIndex(th => th.textContent.startsWith('R_causal'));"
                                "return [...document.querySelectorAll('#results-table tbody tr')].every("
                                "tr => tr.children[i].textContent === '0.5'); })()",
                                90000))
        << browser.Eval("document.querySelector('#results').innerText").dump();
    EXPECT_GT(browser.Eval(filled).get<int>(), filled_early);
    // hc at lr 1e-2 diverged in every shape: marked, not a number.
    EXPECT_EQ(browser.Eval("document.querySelectorAll('#results-table .mark-diverged').length"), 3);
    // Figure 2: one series per design, a point per shape.
    EXPECT_EQ(browser.Eval("document.querySelector('#aspect-chart').dataset.series"), "2");
    EXPECT_EQ(browser.Eval("document.querySelector('#aspect-chart').dataset.points"), "6");
  }

  // Sorting by the "d/L" header, ascending then descending; then a small
  // laptop (1024 px): the charts stack, no table spills the page (wide ones
  // scroll inside their own box).
  void ExpectSortingAndNarrowLayout(Chromium& browser) {
    browser.Eval("[...document.querySelectorAll('#results-table th')].find(th => th.textContent === "
                 "'d/L').click()");
    const std::string aspect_column =
        "(() => { const ths = [...document.querySelectorAll('#results-table th')];"
        "const i = ths.findIndex(th => th.textContent.startsWith('d/L'));"
        "return [...document.querySelectorAll('#results-table tbody tr')].map("
        "tr => Number(tr.children[i].textContent)); })()";
    json asc = browser.Eval(aspect_column);
    ASSERT_TRUE(asc.is_array() && asc.size() == 6u) << asc.dump();
    EXPECT_TRUE(std::is_sorted(asc.begin(), asc.end())) << asc.dump();
    browser.Eval("[...document.querySelectorAll('#results-table th')].find(th => "
                 "th.textContent.startsWith('d/L')).click()");
    json desc = browser.Eval(aspect_column);
    EXPECT_TRUE(std::is_sorted(desc.rbegin(), desc.rend())) << desc.dump();
    Shot(browser, "06-sweep-done");
    ASSERT_TRUE(browser.Resize(1024, 768));
    EXPECT_TRUE(browser.WaitFor("document.documentElement.scrollWidth <= 1024", 5000))
        << browser.Eval("document.documentElement.scrollWidth").dump();
    Shot(browser, "06b-sweep-done-1024px");
    ASSERT_TRUE(browser.Resize(1366, 900));
  }

  // A job's attempts (the crash and its retry, on named workers), then a
  // diagnosed run: its curves and the three heatmaps.
  void ExpectAttemptsAndDiagnostics(Chromium& browser, const std::string& base, int web) {
    json jobs =
        json::parse(HttpGet(web, "/api/jobs?sweep=webtest&arch=hc&page_size=100", bearer_).body);
    int64_t crashed_id = 0, diagnosed_id = 0;
    for (const json& j : jobs["jobs"]) {
      if (j["kind"] == "train" && j["layers"] == 4 && j["lr"].get<double>() < 5e-3) {
        crashed_id = j["id"];
      }
    }
    json results = json::parse(HttpGet(web, "/api/sweeps/webtest/results", bearer_).body);
    for (const json& r : results["rows"]) {
      if (r["arch"] == "pre_ln" && r["layers"] == 4) diagnosed_id = r["diagnosed_job_id"];
    }
    ASSERT_GT(crashed_id, 0);
    ASSERT_GT(diagnosed_id, 0);
    ASSERT_TRUE(browser.Navigate(base + "#/job/" + std::to_string(crashed_id)));
    ASSERT_TRUE(browser.WaitFor(
        "document.querySelectorAll('#attempts-table tbody tr').length === 2", 10000));
    EXPECT_EQ(browser.Eval("document.querySelector('#attempts-table').innerText.includes("
                           "'simulated crash')"),
              true);
    EXPECT_EQ(browser.Eval("document.querySelector('#attempts-table').innerText.includes("
                           "'web-worker-')"),
              true);
    Shot(browser, "07-job-attempts");

    ASSERT_TRUE(browser.Navigate(base + "#/job/" + std::to_string(diagnosed_id)));
    ASSERT_TRUE(
        browser.WaitFor("document.querySelectorAll('#diagnostics canvas').length === 3", 10000))
        << browser.Eval("document.querySelector('#diagnostics').innerText").dump();
    EXPECT_EQ(browser.Eval("document.querySelector('#job-chart').dataset.state"), "succeeded");
    Shot(browser, "08-job-diagnostics");
  }

  std::string dir_, shots_, token_file_;
  const std::string bearer_ = std::string("Bearer ") + kToken;
};

TEST_F(WebViewE2ETest, PagesFollowASweepLiveAndNeedTheToken) {
  // --- the daemons --------------------------------------------------------
  const std::string web_port_file = dir_ + "/web.port";
  SchedulerProcess scheduler(dir_ + "/db.sqlite", dir_,
                             {"--auth-token-file", token_file_, "--web-listen", "127.0.0.1:0",
                              "--web-port-file", web_port_file, "--lease-ttl-ms", "5000"});
  ASSERT_TRUE(scheduler.Start()) << ReadAll(dir_ + "/scheduler.log");
  const int web = ReadPort(web_port_file);
  ASSERT_GT(web, 0);
  const std::string base = "http://127.0.0.1:" + std::to_string(web) + "/";
  EXPECT_NE(ReadAll(dir_ + "/scheduler.log").find("web view on " + base), std::string::npos);
  ExpectEndpointsNeedTheToken(web);

  Chromium browser;
  ASSERT_TRUE(browser.Start(dir_)) << browser.error();

  const std::string ckpt = dir_ + "/checkpoints";
  fs::create_directories(ckpt);
  WorkerProcess w1("web-worker-1", dir_), w2("web-worker-2", dir_);
  w1.Start(scheduler.address(), ckpt, {"--auth-token-file", token_file_});
  w2.Start(scheduler.address(), ckpt, {"--auth-token-file", token_file_});
  ASSERT_NO_FATAL_FAILURE(SubmitSweep(scheduler));

  ASSERT_NO_FATAL_FAILURE(LogIn(browser, base));
  ASSERT_NO_FATAL_FAILURE(ExpectLiveCurve(browser, base, web));
  ASSERT_NO_FATAL_FAILURE(ExpectResultsFillIn(browser, base, web));
  ASSERT_NO_FATAL_FAILURE(ExpectSortingAndNarrowLayout(browser));
  ASSERT_NO_FATAL_FAILURE(ExpectAttemptsAndDiagnostics(browser, base, web));

  // Signing out drops the data and shows the form again.
  browser.Eval("document.querySelector('#logout').click()");
  EXPECT_TRUE(browser.WaitFor("!document.querySelector('#login').hidden && "
                              "document.querySelector('#view').children.length === 0",
                              5000));
  browser.Stop();
  w1.Stop(SIGTERM);
  w2.Stop(SIGTERM);
}

// With --tls-cert/--tls-key the web view speaks HTTPS with the scheduler's
// certificate (and only HTTPS); the token still guards the data.
TEST_F(WebViewE2ETest, ServesHttpsWhenTheSchedulerHasTls) {
  const std::string cert = dir_ + "/cert.pem", key = dir_ + "/key.pem";
  auto [rc, out] = RunCommand(
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
      "-subj /CN=localhost -addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout " +
      key + " -out " + cert + " 2>&1");
  ASSERT_EQ(rc, 0) << "openssl (scripts/setup.sh installs it): " << out;
  const std::string web_port_file = dir_ + "/web.port";
  SchedulerProcess scheduler(dir_ + "/db.sqlite", dir_,
                             {"--tls-cert", cert, "--tls-key", key, "--auth-token-file",
                              token_file_, "--web-listen", "127.0.0.1:0", "--web-port-file",
                              web_port_file});
  ASSERT_TRUE(scheduler.Start()) << ReadAll(dir_ + "/scheduler.log");
  const int web = ReadPort(web_port_file);
  ASSERT_GT(web, 0);
  const std::string base = "https://127.0.0.1:" + std::to_string(web) + "/";
  EXPECT_NE(ReadAll(dir_ + "/scheduler.log").find("web view on " + base), std::string::npos);
  const std::string ca = ReadAll(cert);
  const std::string bearer = std::string("Bearer ") + kToken;
  HttpResult ok = HttpsGet(web, "/api/sweeps", ca, bearer);
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(HttpsGet(web, "/api/sweeps", ca).status, 401);
  EXPECT_EQ(HttpsGet(web, "/", ca).status, 200);
  // Plain HTTP gets no answer.
  EXPECT_EQ(HttpGet(web, "/api/sweeps", bearer).status, 0);

  // The browser (told to accept the self-signed certificate) signs in.
  Chromium browser;
  ASSERT_TRUE(browser.Start(dir_, 1366, 900, {"--ignore-certificate-errors"})) << browser.error();
  ASSERT_TRUE(browser.Navigate(base));
  ASSERT_TRUE(browser.WaitFor("!document.querySelector('#login').hidden", 10000));
  browser.Eval(std::string("document.querySelector('#token').value = '") + kToken +
               "'; document.querySelector('#login-form').requestSubmit()");
  EXPECT_TRUE(browser.WaitFor("document.querySelector('#login').hidden && "
                              "document.querySelector('#sweeps') && "
                              "document.body.innerText.includes('No sweeps yet')",
                              10000))
      << browser.Eval("document.body.innerText").dump();
  EXPECT_EQ(browser.Eval("location.protocol"), "https:");
  Shot(browser, "09-https-sweeps");
}

}  // namespace
}  // namespace depthbench::testing
