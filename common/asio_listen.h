// Opens a listening TCP acceptor on HOST:PORT (port 0: any free port) and
// reports the address it bound: shared by the daemons' HTTP listeners (the
// metrics server and the scheduler's web view). Header-only, since both
// already build on Boost.Asio.
#ifndef DEPTHBENCH_COMMON_ASIO_LISTEN_H_
#define DEPTHBENCH_COMMON_ASIO_LISTEN_H_

#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/host_port.h"

namespace depthbench {

// `what` names the listener in errors ("web", "metrics http").
inline absl::Status ListenOn(boost::asio::io_context& ioc, boost::asio::ip::tcp::acceptor& acceptor,
                             const HostPort& address, const std::string& what,
                             HostPort* bound) {
  namespace net = boost::asio;
  using tcp = net::ip::tcp;
  boost::system::error_code ec;
  tcp::resolver resolver(ioc);
  const auto results =
      resolver.resolve(address.host, std::to_string(address.port),
                       tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) {
    return absl::UnavailableError(
        absl::StrCat(what, ": cannot resolve ", address.ToString(), ": ", ec.message()));
  }
  const tcp::endpoint endpoint = results.begin()->endpoint();
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (!ec) {
    const tcp::endpoint local = acceptor.local_endpoint(ec);
    bound->host = local.address().to_string();
    bound->port = local.port();
  }
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat(what, ": cannot listen on ", address.ToString(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace depthbench

#endif  // DEPTHBENCH_COMMON_ASIO_LISTEN_H_
