// Test helpers for the daemons' monitoring endpoints: a blocking HTTP/1.1
// GET over a loopback TCP socket (no dependencies), a lookup of one sample
// in Prometheus text exposition, and `promtool check metrics`.
//
// Thread safety: stateless free functions. Test-only.
#ifndef DEPTHBENCH_TESTS_INTEGRATION_METRICS_SCRAPE_H_
#define DEPTHBENCH_TESTS_INTEGRATION_METRICS_SCRAPE_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

namespace depthbench::testing {

struct HttpResponse {
  int status = 0;  // 0: no (parsable) response
  std::string body;
};

// A TCP connection to 127.0.0.1:`port` (-1 on failure), with send and
// receive timeouts of `timeout_ms` when above 0.
inline int ConnectLoopback(int port, int timeout_ms = 0) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (timeout_ms > 0) {
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// GET http://127.0.0.1:`port``target` with "Connection: close"; the body is
// read to EOF and de-chunked if sent chunked. Times out after `timeout_ms`
// per socket operation.
inline HttpResponse HttpGet(int port, const std::string& target, int timeout_ms = 5000) {
  HttpResponse out;
  const int fd = ConnectLoopback(port, timeout_ms);
  if (fd < 0) return out;
  std::string request = "GET " + target +
                         " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return out;
  }
  std::string raw;
  char buf[16384];
  while (true) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    raw.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  size_t header_end = raw.find("\r\n\r\n");
  if (raw.compare(0, 9, "HTTP/1.1 ") != 0 || header_end == std::string::npos) return out;
  out.status = std::atoi(raw.c_str() + 9);
  out.body = raw.substr(header_end + 4);
  std::string headers = raw.substr(0, header_end);
  for (char& c : headers) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (headers.find("transfer-encoding: chunked") != std::string::npos) {
    std::string decoded;
    size_t pos = 0;
    while (pos < out.body.size()) {
      size_t eol = out.body.find("\r\n", pos);
      if (eol == std::string::npos) break;
      size_t size = std::strtoul(out.body.c_str() + pos, nullptr, 16);
      if (size == 0) break;
      decoded.append(out.body, eol + 2, size);
      pos = eol + 2 + size + 2;
    }
    out.body = std::move(decoded);
  }
  return out;
}

// The value of the sample whose series is exactly `series` (name plus
// label set as rendered, e.g. `x_total{code="OK",method="AcquireJob"}`), or
// nullopt if absent.
inline std::optional<double> SampleValue(const std::string& exposition,
                                         const std::string& series) {
  std::istringstream in(exposition);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0 &&
        line[series.size()] == ' ') {
      return std::strtod(line.c_str() + series.size() + 1, nullptr);
    }
  }
  return std::nullopt;
}

inline constexpr char kPromtool[] = "/usr/bin/promtool";

// Runs `promtool check metrics` on `exposition`; returns its exit code and
// puts its output in `*output`. Requires kPromtool to exist.
inline int PromtoolCheckMetrics(const std::string& exposition, const std::string& dir,
                                std::string* output) {
  std::string in = dir + "/scrape.txt";
  std::string log = dir + "/promtool.log";
  {
    std::ofstream f(in);
    f << exposition;
  }
  std::string cmd = std::string(kPromtool) + " check metrics < " + in + " > " + log + " 2>&1";
  int rc = std::system(cmd.c_str());
  std::ifstream l(log);
  std::stringstream ss;
  ss << l.rdbuf();
  *output = ss.str();
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace depthbench::testing

#endif  // DEPTHBENCH_TESTS_INTEGRATION_METRICS_SCRAPE_H_
