// A gRPC server interceptor that reports every RPC's method, final status
// code and handling time to a callback (the scheduler's metrics exporter
// counts them in depthbench_scheduler_rpcs_total and observes them in
// depthbench_scheduler_rpc_duration_seconds). Being an interceptor, it sees
// every method of every registered service, including calls refused by the
// auth check, without touching the handlers.
//
//   builder.experimental().SetInterceptorCreators(
//       MakeRpcMetricsInterceptors([&](const std::string& method,
//                                      const std::string& code, double s) {
//         metrics.RecordRpc(method, code, s);
//       }));
//
// Reported values: method is the bare RPC name ("AcquireJob"); code is the
// status code name as absl::StatusCodeToString writes it ("OK",
// "NOT_FOUND", ...); seconds run from the call being matched to its status
// being sent (for streaming RPCs: the whole stream). A call that ends
// without a status being sent (e.g. server shutdown) is reported once as
// "CANCELLED".
//
// Thread safety: the callback runs on gRPC's handler threads, concurrently
// for different calls; it must be thread-safe and quick. Ownership: the
// factory owns a copy of the callback; gRPC owns the factories once handed to
// the ServerBuilder.
#ifndef DEPTHBENCH_SCHEDULER_RPC_METRICS_INTERCEPTOR_H_
#define DEPTHBENCH_SCHEDULER_RPC_METRICS_INTERCEPTOR_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/support/server_interceptor.h>

namespace depthbench::scheduler {

using RpcObserver = std::function<void(const std::string& method,
                                       const std::string& code, double seconds)>;

// "/depthbench.v1.WorkerService/AcquireJob" -> "AcquireJob".
std::string RpcMethodName(const char* full_method);

// The interceptor factories to hand to
// ServerBuilder::experimental().SetInterceptorCreators(); empty if
// `observer` is null.
std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
MakeRpcMetricsInterceptors(RpcObserver observer);

}  // namespace depthbench::scheduler

#endif  // DEPTHBENCH_SCHEDULER_RPC_METRICS_INTERCEPTOR_H_
