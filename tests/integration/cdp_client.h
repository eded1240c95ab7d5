// Test helpers for driving a real browser: Debian's headless Chromium as a
// child process, spoken to over the Chrome DevTools Protocol (a WebSocket,
// Boost.Beast), plus a plain HTTP GET for checking endpoints directly.
//
//   Chromium browser;
//   ASSERT_TRUE(browser.Start(dir)) << browser.error();
//   browser.Navigate("http://127.0.0.1:8080/");
//   nlohmann::json v = browser.Eval("document.title");
//   browser.Screenshot(dir + "/page.png");
//
// Thread safety: one thread per instance.
#ifndef DEPTHBENCH_TESTS_INTEGRATION_CDP_CLIENT_H_
#define DEPTHBENCH_TESTS_INTEGRATION_CDP_CLIENT_H_

#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"

namespace depthbench::testing {

namespace cdp_detail {
namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
}  // namespace cdp_detail

struct HttpResult {
  int status = 0;  // 0: no answer
  std::string body;
  std::string content_type;
};

namespace cdp_detail {
// One GET of `target` on a connected stream (plain TCP or TLS); throws on
// I/O errors.
template <class Stream>
HttpResult GetOn(Stream& stream, const std::string& target, const std::string& authorization) {
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, "127.0.0.1");
  if (!authorization.empty()) req.set(http::field::authorization, authorization);
  http::write(stream, req);
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  http::read(stream, buffer, res);
  HttpResult out;
  out.status = static_cast<int>(res.result_int());
  out.body = res.body();
  out.content_type = std::string(res[http::field::content_type]);
  return out;
}
}  // namespace cdp_detail

// GET http://127.0.0.1:PORT/TARGET with an optional Authorization header.
inline HttpResult HttpGet(int port, const std::string& target,
                          const std::string& authorization = "") {
  using namespace cdp_detail;
  HttpResult out;
  try {
    net::io_context ioc;
    tcp::resolver resolver(ioc);
    beast::tcp_stream stream(ioc);
    stream.connect(resolver.resolve("127.0.0.1", std::to_string(port)));
    out = cdp_detail::GetOn(stream, target, authorization);
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  } catch (const std::exception& e) {
    out.body = e.what();
  }
  return out;
}

// GET https://127.0.0.1:PORT/TARGET trusting only `ca_pem` and checking that
// the certificate names 127.0.0.1.
inline HttpResult HttpsGet(int port, const std::string& target, const std::string& ca_pem,
                           const std::string& authorization = "") {
  using namespace cdp_detail;
  namespace ssl = net::ssl;
  HttpResult out;
  try {
    net::io_context ioc;
    ssl::context ctx(ssl::context::tls_client);
    ctx.add_certificate_authority(net::buffer(ca_pem));
    ctx.set_verify_mode(ssl::verify_peer);
    beast::ssl_stream<beast::tcp_stream> stream(ioc, ctx);
    stream.set_verify_callback(ssl::host_name_verification("127.0.0.1"));
    tcp::resolver resolver(ioc);
    beast::get_lowest_layer(stream).connect(resolver.resolve("127.0.0.1", std::to_string(port)));
    stream.handshake(ssl::stream_base::client);
    out = cdp_detail::GetOn(stream, target, authorization);
  } catch (const std::exception& e) {
    out.body = e.what();
  }
  return out;
}

// The browser executable: $CHROMIUM, else Debian's chromium.
inline std::string ChromiumPath() {
  const char* env = std::getenv("CHROMIUM");
  if (env != nullptr && *env != '\0') return env;
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser"}) {
    if (std::filesystem::exists(p)) return p;
  }
  return "";
}

class Chromium {
 public:
  Chromium() = default;
  ~Chromium() { Stop(); }
  Chromium(const Chromium&) = delete;
  Chromium& operator=(const Chromium&) = delete;

  // Starts headless Chromium with a fresh profile under `dir` and attaches
  // to its first page. False (see error()) when it cannot.
  // `extra` flags go before the start URL (e.g. --ignore-certificate-errors).
  bool Start(const std::string& dir, int width = 1366, int height = 900,
             const std::vector<std::string>& extra = {}) {
    using namespace cdp_detail;
    const std::string bin = ChromiumPath();
    if (bin.empty()) {
      error_ = "chromium not found (apt-get install chromium; scripts/setup.sh installs it)";
      return false;
    }
    const std::string profile = dir + "/chromium-profile";
    std::filesystem::create_directories(profile);
    const std::string port_file = profile + "/DevToolsActivePort";
    std::filesystem::remove(port_file);
    std::vector<std::string> args = {bin,
                                     "--headless=new",
                                     "--remote-debugging-port=0",
                                     "--remote-allow-origins=*",
                                     "--user-data-dir=" + profile,
                                     "--no-sandbox",  // tests run as root in CI
                                     "--disable-gpu",
                                     "--disable-dev-shm-usage",
                                     "--no-first-run",
                                     "--no-default-browser-check",
                                     "--disable-extensions",
                                     "--disable-background-networking",
                                     "--hide-scrollbars",
                                     "--window-size=" + std::to_string(width) + "," +
                                         std::to_string(height)};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("about:blank");
    const std::string log = dir + "/chromium.log";
    pid_ = fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      FILE* e = freopen(log.c_str(), "a", stderr);
      FILE* o = freopen(log.c_str(), "a", stdout);
      (void)e;
      (void)o;
      setpgid(0, 0);  // its own group: Stop() ends the renderers too
      execv(argv[0], argv.data());
      _exit(127);
    }
    int devtools_port = 0;
    for (int i = 0; i < 600 && devtools_port == 0; ++i) {  // up to 30 s
      std::ifstream in(port_file);
      int p = 0;
      if (in >> p && p > 0) devtools_port = p;
      if (devtools_port == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        error_ = "chromium exited at start; see " + log;
        return false;
      }
    }
    if (devtools_port == 0) {
      error_ = "chromium wrote no DevToolsActivePort within 30 s; see " + log;
      return false;
    }
    // The page target's WebSocket.
    std::string ws_path;
    for (int i = 0; i < 100 && ws_path.empty(); ++i) {
      HttpResult list = HttpGet(devtools_port, "/json/list");
      nlohmann::json targets = nlohmann::json::parse(list.body, nullptr, false);
      if (targets.is_array()) {
        for (const auto& t : targets) {
          if (t.value("type", "") == "page" && t.contains("webSocketDebuggerUrl")) {
            std::string url = t["webSocketDebuggerUrl"];
            ws_path = url.substr(url.find('/', std::string("ws://").size()));
            break;
          }
        }
      }
      if (ws_path.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (ws_path.empty()) {
      error_ = "no page target in /json/list";
      return false;
    }
    try {
      ws_.emplace(ioc_);
      tcp::resolver resolver(ioc_);
      net::connect(ws_->next_layer(), resolver.resolve("127.0.0.1", std::to_string(devtools_port)));
      // A read that waits longer than this fails instead of hanging the test.
      timeval tv{60, 0};
      setsockopt(ws_->next_layer().native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      ws_->read_message_max(256u << 20);
      ws_->handshake("127.0.0.1:" + std::to_string(devtools_port), ws_path);
    } catch (const std::exception& e) {
      error_ = std::string("devtools websocket: ") + e.what();
      return false;
    }
    Call("Page.enable");
    Call("Runtime.enable");
    // Every page collects its uncaught errors for PageErrors().
    Call("Page.addScriptToEvaluateOnNewDocument",
         {{"source",
           "window.__pageErrors = [];"
           "addEventListener('error', e => __pageErrors.push(String(e.message)));"
           "addEventListener('unhandledrejection', e => __pageErrors.push(String(e.reason)));"}});
    Call("Emulation.setDeviceMetricsOverride",
         {{"width", width}, {"height", height}, {"deviceScaleFactor", 1}, {"mobile", false}});
    return true;
  }

  const std::string& error() const { return error_; }

  void Stop() {
    if (ws_) {
      boost::beast::error_code ec;
      ws_->next_layer().close(ec);
      ws_.reset();
    }
    if (pid_ > 0) {
      kill(-pid_, SIGKILL);
      kill(pid_, SIGKILL);
      int status = 0;
      waitpid(pid_, &status, 0);
      pid_ = -1;
    }
  }

  // One DevTools command; its "result", or an object {"error": ...}.
  nlohmann::json Call(const std::string& method, nlohmann::json params = nlohmann::json::object()) {
    if (!ws_) return {{"error", "not connected"}};
    const int id = ++next_id_;
    try {
      ws_->text(true);
      ws_->write(boost::asio::buffer(
          nlohmann::json{{"id", id}, {"method", method}, {"params", std::move(params)}}.dump()));
      while (true) {
        boost::beast::flat_buffer buffer;
        ws_->read(buffer);
        nlohmann::json msg =
            nlohmann::json::parse(boost::beast::buffers_to_string(buffer.data()), nullptr, false);
        if (!msg.is_object() || !msg.contains("id") || msg["id"] != id) continue;  // events
        if (msg.contains("error")) return {{"error", msg["error"]}};
        return msg.value("result", nlohmann::json::object());
      }
    } catch (const std::exception& e) {
      return {{"error", std::string("devtools: ") + e.what()}};
    }
  }

  // Evaluates `expression` in the page (awaiting a promise); its value, or
  // null when it threw.
  nlohmann::json Eval(const std::string& expression) {
    nlohmann::json r = Call("Runtime.evaluate", {{"expression", expression},
                                                 {"returnByValue", true},
                                                 {"awaitPromise", true}});
    if (r.contains("error") || r.contains("exceptionDetails")) {
      last_eval_error_ = r.dump();
      return nullptr;
    }
    return r["result"].value("value", nlohmann::json());
  }
  const std::string& last_eval_error() const { return last_eval_error_; }

  // Emulates a viewport of width x height CSS pixels.
  bool Resize(int width, int height) {
    return !Call("Emulation.setDeviceMetricsOverride", {{"width", width},
                                                         {"height", height},
                                                         {"deviceScaleFactor", 1},
                                                         {"mobile", false}})
                .contains("error");
  }

  // Uncaught errors and unhandled rejections of the current document.
  // null when the collector is missing (then the check fails rather than passing empty).
  nlohmann::json PageErrors() { return Eval("window.__pageErrors"); }

  // Loads `url` and waits for the document to be complete.
  bool Navigate(const std::string& url) {
    nlohmann::json r = Call("Page.navigate", {{"url", url}});
    if (r.contains("error")) return false;
    return WaitFor("document.readyState === 'complete' && location.href === " +
                       nlohmann::json(url).dump(),
                   15000);
  }

  // Polls `expression` until it is truthy or `timeout_ms` passes.
  bool WaitFor(const std::string& expression, int timeout_ms) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (true) {
      nlohmann::json v = Eval("!!(" + expression + ")");
      if (v.is_boolean() && v.get<bool>()) return true;
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  // Writes a PNG of the whole page (up to 4000 px tall) to `path`.
  bool Screenshot(const std::string& path) {
    nlohmann::json metrics = Call("Page.getLayoutMetrics");
    double width = 1366, height = 900;
    if (metrics.contains("cssContentSize")) {
      width = metrics["cssContentSize"].value("width", width);
      height = std::min(4000.0, metrics["cssContentSize"].value("height", height));
    }
    nlohmann::json r = Call("Page.captureScreenshot",
                            {{"format", "png"},
                             {"captureBeyondViewport", true},
                             {"clip", {{"x", 0}, {"y", 0}, {"width", width},
                                       {"height", height}, {"scale", 1}}}});
    if (!r.contains("data")) return false;
    std::string png;
    if (!absl::Base64Unescape(r["data"].get<std::string>(), &png)) return false;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << png;
    return static_cast<bool>(out);
  }

 private:
  pid_t pid_ = -1;
  boost::asio::io_context ioc_;
  std::optional<boost::beast::websocket::stream<boost::asio::ip::tcp::socket>> ws_;
  int next_id_ = 0;
  std::string error_;
  std::string last_eval_error_;
};

}  // namespace depthbench::testing

#endif  // DEPTHBENCH_TESTS_INTEGRATION_CDP_CLIENT_H_
