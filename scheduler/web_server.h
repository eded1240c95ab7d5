// The HTTP(S) listener of the scheduler's web view (Boost.Beast over Asio,
// OpenSSL for TLS): hands every request to one handler (web_api.h) and
// writes what it returns. Only GET and HEAD reach the handler; any other
// method gets 405, a request body is refused (the view is read-only).
//
//   WebServerOptions options;
//   options.listen = "127.0.0.1:8080";
//   options.tls_cert_pem = ...;  // both PEMs set: HTTPS only
//   ASSIGN_OR_RETURN(auto web, WebServer::Start(options, [&](const WebRequest& r) {
//     return api.Handle(r);
//   }));
//   LOG << web->url();  // "http://127.0.0.1:8080/"
//
// Connections are HTTP/1.1 keep-alive; a request must arrive within
// io_timeout_ms and its headers may not exceed 8 KiB. At most
// max_connections are open at once; more are closed on accept (the gRPC
// listener needs the process's descriptors too).
//
// Thread safety: Start() returns a running server whose threads call the
// handler, concurrently when num_threads > 1; the handler must be
// thread-safe. port(), url() and Stop() are safe from any thread.
// Ownership: the server owns its copy of the handler; whatever the handler
// borrows must outlive Stop().
#ifndef DEPTHBENCH_SCHEDULER_WEB_SERVER_H_
#define DEPTHBENCH_SCHEDULER_WEB_SERVER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/host_port.h"

namespace depthbench::scheduler {

struct WebRequest {
  std::string method;  // "GET" or "HEAD"
  std::string path;    // percent-decoded, without the query string
  std::map<std::string, std::string> query;  // percent-decoded; last one wins
  std::string authorization;                 // the Authorization header
};

struct WebResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra ones
};

using WebHandler = std::function<WebResponse(const WebRequest&)>;

struct WebServerOptions {
  std::string listen = "127.0.0.1:0";  // HOST:PORT; port 0 picks a free one
  int num_threads = 2;
  int64_t io_timeout_ms = 30'000;
  int max_connections = 64;
  std::string tls_cert_pem;  // both set: TLS (HTTPS); neither: plain HTTP
  std::string tls_key_pem;
};

class WebServer {
 public:
  // Binds and serves. InvalidArgument for bad options or PEMs; Unavailable
  // when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<WebServer>> Start(const WebServerOptions& options,
                                                          WebHandler handler);
  ~WebServer();
  WebServer(const WebServer&) = delete;
  WebServer& operator=(const WebServer&) = delete;

  uint16_t port() const;
  HostPort bound_address() const;
  bool tls() const;
  // "http://HOST:PORT/" or "https://HOST:PORT/"; a wildcard host
  // (0.0.0.0, ::) is shown as 127.0.0.1.
  std::string url() const;
  // Stops accepting, closes connections, joins the threads. Idempotent.
  void Stop();

  class Impl;

 private:
  explicit WebServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Percent-decodes `s` ('+' stays '+'); false for a malformed escape.
bool PercentDecode(const std::string& s, std::string* out);

}  // namespace depthbench::scheduler

#endif  // DEPTHBENCH_SCHEDULER_WEB_SERVER_H_
