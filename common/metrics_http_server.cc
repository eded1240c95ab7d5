#include "common/metrics_http_server.h"

#include <chrono>
#include <list>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/asio_listen.h"
#include "common/status_macros.h"

namespace depthbench {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

constexpr size_t kHeaderLimitBytes = 8 * 1024;
constexpr size_t kBodyLimitBytes = 1024;

// Builds responses; shared read-only by every session.
class Router {
 public:
  Router(const MetricsRegistry* registry,
         MetricsHttpServer::ReadinessCheck readiness)
      : registry_(registry), readiness_(std::move(readiness)) {}

  Response Handle(const Request& request) const {
    beast::string_view target = request.target();
    const size_t query = target.find('?');
    if (query != beast::string_view::npos) target = target.substr(0, query);

    Response response;
    response.version(request.version());
    response.keep_alive(request.keep_alive());
    response.set(http::field::server, "depthbench");

    const bool known =
        target == "/metrics" || target == "/healthz" || target == "/readyz";
    if (!known) {
      Fill(http::status::not_found, "text/plain; charset=utf-8",
           "not found\n", request, &response);
      return response;
    }
    if (request.method() != http::verb::get &&
        request.method() != http::verb::head) {
      response.set(http::field::allow, "GET, HEAD");
      Fill(http::status::method_not_allowed, "text/plain; charset=utf-8",
           "method not allowed\n", request, &response);
      return response;
    }
    if (target == "/metrics") {
      Fill(http::status::ok, MetricsRegistry::kContentType,
           registry_->Render(), request, &response);
    } else if (target == "/healthz") {
      Fill(http::status::ok, "text/plain; charset=utf-8", "ok\n", request,
           &response);
    } else {
      const absl::Status ready =
          readiness_ == nullptr ? absl::OkStatus() : readiness_();
      if (ready.ok()) {
        Fill(http::status::ok, "text/plain; charset=utf-8", "ready\n",
             request, &response);
      } else {
        Fill(http::status::service_unavailable, "text/plain; charset=utf-8",
             absl::StrCat("not ready: ", ready.ToString(), "\n"), request,
             &response);
      }
    }
    return response;
  }

 private:
  static void Fill(http::status status, const char* content_type,
                   std::string body, const Request& request,
                   Response* response) {
    response->result(status);
    response->set(http::field::content_type, content_type);
    if (request.method() == http::verb::head) {
      // Same headers as GET, no body.
      response->content_length(body.size());
    } else {
      response->body() = std::move(body);
      response->prepare_payload();
    }
  }

  const MetricsRegistry* const registry_;
  const MetricsHttpServer::ReadinessCheck readiness_;
};

// One connection: read a request, write its response, repeat while
// keep-alive. Owned by the shared_ptrs held in its pending handlers.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const Router* router,
          std::chrono::milliseconds timeout)
      : stream_(std::move(socket)), router_(router), timeout_(timeout) {}

  void Run() {
    net::dispatch(stream_.get_executor(),
                  beast::bind_front_handler(&Session::DoRead,
                                            shared_from_this()));
  }

  // Closes the connection from any thread (on the session's strand); the
  // pending operation ends with an error and the session goes away.
  void Evict() {
    net::post(stream_.get_executor(), [self = shared_from_this()] {
      beast::error_code ec;
      self->stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
      self->stream_.close();
    });
  }

 private:
  void DoRead() {
    parser_.emplace();
    parser_->header_limit(kHeaderLimitBytes);
    parser_->body_limit(kBodyLimitBytes);
    stream_.expires_after(timeout_);
    http::async_read(
        stream_, buffer_, *parser_,
        beast::bind_front_handler(&Session::OnRead, shared_from_this()));
  }

  void OnRead(beast::error_code ec, size_t /*bytes*/) {
    if (ec == http::error::end_of_stream) {
      DoClose();
      return;
    }
    if (ec) return;  // timeout, reset or malformed request: drop connection
    response_ = router_->Handle(parser_->get());
    stream_.expires_after(timeout_);
    http::async_write(stream_, response_,
                      beast::bind_front_handler(&Session::OnWrite,
                                                shared_from_this(),
                                                response_.need_eof()));
  }

  void OnWrite(bool close, beast::error_code ec, size_t /*bytes*/) {
    if (ec) return;
    if (close) {
      DoClose();
      return;
    }
    DoRead();
  }

  void DoClose() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Response response_;
  const Router* const router_;
  const std::chrono::milliseconds timeout_;
};

// The open sessions, oldest first (shared with the accept handler; the
// entries are weak, so a closed session simply expires).
class SessionList {
 public:
  // Adds `session` and picks the oldest sessions to evict so that at most
  // `max` stay open. Returns false (the new connection must be refused)
  // while evicted ones are slow to close and twice `max` still hold
  // descriptors.
  bool Admit(const std::shared_ptr<Session>& session, size_t max,
             std::vector<std::shared_ptr<Session>>* evict) {
    absl::MutexLock lock(&mu_);
    size_t kept = 0;
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if (it->session.expired()) {
        it = sessions_.erase(it);
      } else {
        kept += it->evicted ? 0 : 1;
        ++it;
      }
    }
    if (sessions_.size() >= 2 * max) return false;
    sessions_.push_back({session, false});
    ++kept;
    for (auto it = sessions_.begin(); kept > max && it != sessions_.end(); ++it) {
      if (it->evicted) continue;
      it->evicted = true;
      --kept;
      if (std::shared_ptr<Session> old = it->session.lock()) {
        evict->push_back(std::move(old));
      }
    }
    return true;
  }

 private:
  struct Entry {
    std::weak_ptr<Session> session;
    bool evicted;
  };
  absl::Mutex mu_;
  std::list<Entry> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

class MetricsHttpServer::Impl {
 public:
  Impl(const MetricsHttpServerOptions& options,
       const MetricsRegistry* registry, ReadinessCheck readiness)
      : router_(registry, std::move(readiness)),
        timeout_(options.io_timeout_ms),
        max_connections_(static_cast<size_t>(options.max_connections)),
        acceptor_(ioc_),
        retry_timer_(ioc_) {}

  ~Impl() {
    // Stopping the context makes every server thread return; the acceptor
    // then closes with its destructor and the sessions die (closing their
    // sockets) with the pending handlers that own them when ioc_ (declared
    // first, destroyed last) is destroyed.
    ioc_.stop();
    for (std::thread& t : threads_) t.join();
  }

  absl::Status Bind(const HostPort& address) {
    return ListenOn(ioc_, acceptor_, address, "metrics http", &bound_);
  }

  void StartThreads(int num_threads) {
    DoAccept();
    for (int i = 0; i < num_threads; ++i) {
      threads_.emplace_back([this] { ioc_.run(); });
    }
  }

  const HostPort& bound() const { return bound_; }

 private:
  void DoAccept() {
    acceptor_.async_accept(
        net::make_strand(ioc_), [this](beast::error_code ec, tcp::socket s) {
          if (ec == net::error::operation_aborted || !acceptor_.is_open()) {
            return;
          }
          if (ec) {
            // E.g. out of file descriptors: back off instead of spinning.
            retry_timer_.expires_after(std::chrono::milliseconds(100));
            retry_timer_.async_wait([this](beast::error_code wait_ec) {
              if (!wait_ec) DoAccept();
            });
            return;
          }
          auto session =
              std::make_shared<Session>(std::move(s), &router_, timeout_);
          std::vector<std::shared_ptr<Session>> evict;
          if (sessions_->Admit(session, max_connections_, &evict)) {
            for (const auto& old : evict) old->Evict();
            session->Run();
          }  // else: dropped here, which closes the socket
          DoAccept();
        });
  }

  // Declared first: destroyed after everything that refers to it.
  net::io_context ioc_;
  const Router router_;
  const std::chrono::milliseconds timeout_;
  const size_t max_connections_;
  const std::shared_ptr<SessionList> sessions_ = std::make_shared<SessionList>();
  tcp::acceptor acceptor_;
  net::steady_timer retry_timer_;
  HostPort bound_;
  std::vector<std::thread> threads_;
};

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const MetricsHttpServerOptions& options, const MetricsRegistry* registry,
    ReadinessCheck readiness) {
  if (registry == nullptr) {
    return absl::InvalidArgumentError("metrics http: registry is null");
  }
  if (options.num_threads < 1 || options.io_timeout_ms < 1 ||
      options.max_connections < 1) {
    return absl::InvalidArgumentError(
        "metrics http: num_threads, io_timeout_ms and max_connections must be "
        "positive");
  }
  ASSIGN_OR_RETURN(HostPort address, ParseHostPort(options.listen));
  auto impl = std::make_unique<Impl>(options, registry, std::move(readiness));
  RETURN_IF_ERROR(impl->Bind(address));
  impl->StartThreads(options.num_threads);
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(std::move(impl)));
}

MetricsHttpServer::MetricsHttpServer(std::unique_ptr<Impl> impl)
    : bound_(impl->bound()), impl_(std::move(impl)) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

uint16_t MetricsHttpServer::port() const { return bound_.port; }

HostPort MetricsHttpServer::bound_address() const { return bound_; }

void MetricsHttpServer::Stop() {
  std::unique_ptr<Impl> impl;
  {
    absl::MutexLock lock(&mu_);
    impl = std::move(impl_);
  }
  impl.reset();  // joins the server threads
}

}  // namespace depthbench
