#include "scheduler/web_server.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/asio_listen.h"
#include "common/status_macros.h"

namespace depthbench::scheduler {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;

constexpr size_t kHeaderLimitBytes = 8 * 1024;
constexpr size_t kBodyLimitBytes = 0;

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Splits "a=1&b=x%20y" into decoded pairs; false when an escape is bad.
bool ParseQuery(const std::string& query, std::map<std::string, std::string>* out) {
  size_t start = 0;
  while (start <= query.size()) {
    size_t end = query.find('&', start);
    if (end == std::string::npos) end = query.size();
    std::string part = query.substr(start, end - start);
    if (!part.empty()) {
      size_t eq = part.find('=');
      std::string key, value;
      if (!PercentDecode(part.substr(0, eq), &key)) return false;
      if (eq != std::string::npos && !PercentDecode(part.substr(eq + 1), &value)) return false;
      (*out)[key] = value;
    }
    start = end + 1;
  }
  return true;
}

http::response<http::string_body> Render(const http::request<http::string_body>& request,
                                         const WebHandler& handler) {
  http::response<http::string_body> response;
  response.version(request.version());
  response.keep_alive(request.keep_alive());
  response.set(http::field::server, "depthbench");
  WebResponse out;
  const std::string target(request.target());
  const size_t q = target.find('?');
  WebRequest in;
  in.method = std::string(request.method_string());
  in.authorization = std::string(request[http::field::authorization]);
  if (request.method() != http::verb::get && request.method() != http::verb::head) {
    out.status = 405;
    out.content_type = "application/json";
    out.body = R"json({"error":"method not allowed: the web view is read-only (GET, HEAD)"})json";
    out.headers.push_back({"Allow", "GET, HEAD"});
  } else if (!PercentDecode(target.substr(0, q), &in.path) ||
             (q != std::string::npos && !ParseQuery(target.substr(q + 1), &in.query))) {
    out.status = 400;
    out.body = R"({"error":"request target: malformed percent-escape"})";
  } else {
    try {
      out = handler(in);
    } catch (const std::exception& e) {
      // A server thread must not die with the request (std::terminate).
      out = WebResponse();
      out.status = 500;
      out.body = nlohmann::json{{"error", std::string("internal error: ") + e.what()}}.dump(
          -1, ' ', false, nlohmann::json::error_handler_t::replace);
    }
  }
  response.result(static_cast<unsigned>(out.status));
  response.set(http::field::content_type, out.content_type);
  for (const auto& [name, value] : out.headers) response.set(name, value);
  if (request.method() == http::verb::head) {
    response.content_length(out.body.size());
  } else {
    response.body() = std::move(out.body);
    response.prepare_payload();
  }
  return response;
}

// Counts open connections (shared with sessions, which may outlive Impl's
// members only until the io_context is destroyed).
struct Shared {
  WebHandler handler;
  std::chrono::milliseconds timeout;
  std::atomic<int> open{0};
};

// One connection over `Stream` (beast::tcp_stream or an ssl_stream of one):
// (TLS handshake,) read a request, write its response, repeat while
// keep-alive.
template <typename Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
 public:
  template <typename... Args>
  Session(std::shared_ptr<Shared> shared, Args&&... args)
      : stream_(std::forward<Args>(args)...), shared_(std::move(shared)) {
    shared_->open.fetch_add(1);
  }
  ~Session() { shared_->open.fetch_sub(1); }

  void Run() {
    net::dispatch(stream_.get_executor(), [self = this->shared_from_this()] { self->Begin(); });
  }

 private:
  beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }

  void Begin() {
    if constexpr (std::is_same_v<Stream, beast::tcp_stream>) {
      DoRead();
    } else {
      Lowest().expires_after(shared_->timeout);
      stream_.async_handshake(ssl::stream_base::server,
                              [self = this->shared_from_this()](beast::error_code ec) {
                                if (!ec) self->DoRead();
                              });
    }
  }

  void DoRead() {
    parser_.emplace();
    parser_->header_limit(kHeaderLimitBytes);
    parser_->body_limit(kBodyLimitBytes);
    Lowest().expires_after(shared_->timeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = this->shared_from_this()](beast::error_code ec, size_t) {
                       self->OnRead(ec);
                     });
  }

  void OnRead(beast::error_code ec) {
    if (ec) {
      Close();  // end of stream, timeout, reset, malformed or oversized request
      return;
    }
    response_ = Render(parser_->get(), shared_->handler);
    Lowest().expires_after(shared_->timeout);
    http::async_write(stream_, response_,
                      [self = this->shared_from_this()](beast::error_code wec, size_t) {
                        if (wec) return;
                        if (self->response_.need_eof()) {
                          self->Close();
                        } else {
                          self->DoRead();
                        }
                      });
  }

  void Close() {
    beast::error_code ec;
    Lowest().socket().shutdown(tcp::socket::shutdown_both, ec);
    Lowest().close();
  }

  Stream stream_;
  std::shared_ptr<Shared> shared_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::string_body> response_;
};

}  // namespace

bool PercentDecode(const std::string& s, std::string* out) {
  out->clear();
  out->reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out->push_back(s[i]);
      continue;
    }
    if (i + 2 >= s.size()) return false;
    const int hi = HexValue(s[i + 1]), lo = HexValue(s[i + 2]);
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return true;
}

class WebServer::Impl {
 public:
  Impl(const WebServerOptions& options, WebHandler handler)
      : ssl_ctx_(ssl::context::tls_server),
        max_connections_(options.max_connections),
        acceptor_(ioc_) {
    shared_->handler = std::move(handler);
    shared_->timeout = std::chrono::milliseconds(options.io_timeout_ms);
  }

  ~Impl() { Stop(); }

  void Stop() {
    absl::MutexLock lock(&stop_mu_);
    ioc_.stop();
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
    threads_.clear();
  }

  absl::Status UseTls(const std::string& cert_pem, const std::string& key_pem) {
    beast::error_code ec;
    ssl_ctx_.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                             ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                             ssl::context::no_tlsv1_1,
                         ec);
    if (!ec) ssl_ctx_.use_certificate_chain(net::buffer(cert_pem), ec);
    if (ec) return absl::InvalidArgumentError(absl::StrCat("tls_cert_pem: ", ec.message()));
    ssl_ctx_.use_private_key(net::buffer(key_pem), ssl::context::pem, ec);
    if (ec) return absl::InvalidArgumentError(absl::StrCat("tls_key_pem: ", ec.message()));
    tls_ = true;
    return absl::OkStatus();
  }

  absl::Status Bind(const HostPort& address) {
    return ListenOn(ioc_, acceptor_, address, "web", &bound_);
  }

  void StartThreads(int n) {
    DoAccept();
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { ioc_.run(); });
  }

  const HostPort& bound() const { return bound_; }
  bool tls() const { return tls_; }

 private:
  void DoAccept() {
    acceptor_.async_accept(net::make_strand(ioc_), [this](beast::error_code ec,
                                                           tcp::socket socket) {
      if (ec == net::error::operation_aborted || !acceptor_.is_open()) return;
      if (ec) {
        // E.g. out of descriptors: try again shortly instead of spinning.
        auto timer = std::make_shared<net::steady_timer>(ioc_, std::chrono::milliseconds(100));
        timer->async_wait([this, timer](beast::error_code) { DoAccept(); });
        return;
      }
      if (shared_->open.load() < max_connections_) {
        if (tls_) {
          std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(
              shared_, std::move(socket), ssl_ctx_)
              ->Run();
        } else {
          std::make_shared<Session<beast::tcp_stream>>(shared_, std::move(socket))->Run();
        }
      }  // else: the socket closes here
      DoAccept();
    });
  }

  // Outlives ioc_: TLS sessions, destroyed with ioc_'s pending handlers,
  // were made from it.
  ssl::context ssl_ctx_;
  // Declared before the rest: destroyed after them (pending handlers own
  // the sessions).
  net::io_context ioc_;
  std::shared_ptr<Shared> shared_ = std::make_shared<Shared>();
  const int max_connections_;
  bool tls_ = false;
  absl::Mutex stop_mu_;  // Stop() from several threads joins once
  tcp::acceptor acceptor_;
  HostPort bound_;
  std::vector<std::thread> threads_;
};

absl::StatusOr<std::unique_ptr<WebServer>> WebServer::Start(const WebServerOptions& options,
                                                            WebHandler handler) {
  if (handler == nullptr) return absl::InvalidArgumentError("web: handler is null");
  if (options.num_threads < 1 || options.io_timeout_ms < 1 || options.max_connections < 1) {
    return absl::InvalidArgumentError(
        "web: num_threads, io_timeout_ms and max_connections must be positive");
  }
  if (options.tls_cert_pem.empty() != options.tls_key_pem.empty()) {
    return absl::InvalidArgumentError("web: tls_cert_pem and tls_key_pem must be given together");
  }
  ASSIGN_OR_RETURN(HostPort address, ParseHostPort(options.listen));
  auto impl = std::make_unique<Impl>(options, std::move(handler));
  if (!options.tls_cert_pem.empty()) {
    RETURN_IF_ERROR(impl->UseTls(options.tls_cert_pem, options.tls_key_pem));
  }
  RETURN_IF_ERROR(impl->Bind(address));
  impl->StartThreads(options.num_threads);
  return std::unique_ptr<WebServer>(new WebServer(std::move(impl)));
}

WebServer::WebServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
WebServer::~WebServer() { Stop(); }

uint16_t WebServer::port() const { return impl_->bound().port; }
HostPort WebServer::bound_address() const { return impl_->bound(); }
bool WebServer::tls() const { return impl_->tls(); }

std::string WebServer::url() const {
  std::string host = impl_->bound().host;
  if (host == "0.0.0.0" || host == "::") host = "127.0.0.1";
  if (host.find(':') != std::string::npos) host = absl::StrCat("[", host, "]");
  return absl::StrCat(tls() ? "https" : "http", "://", host, ":", port(), "/");
}

void WebServer::Stop() { impl_->Stop(); }

}  // namespace depthbench::scheduler
