#include "scheduler/rpc_metrics_interceptor.h"

#include <chrono>
#include <cstring>
#include <utility>

#include "absl/status/status.h"

namespace depthbench::scheduler {

namespace exp = ::grpc::experimental;

std::string RpcMethodName(const char* full_method) {
  if (full_method == nullptr) return "unknown";
  const char* slash = std::strrchr(full_method, '/');
  return slash != nullptr ? std::string(slash + 1) : std::string(full_method);
}

namespace {

// One per call; gRPC deletes it when the call is done.
class RpcMetricsInterceptor final : public exp::Interceptor {
 public:
  RpcMetricsInterceptor(exp::ServerRpcInfo* info, const RpcObserver* observer)
      : method_(RpcMethodName(info->method())),
        observer_(observer),
        start_(std::chrono::steady_clock::now()) {}

  ~RpcMetricsInterceptor() override {
    if (!reported_) Report(grpc::StatusCode::CANCELLED);
  }

  void Intercept(exp::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            exp::InterceptionHookPoints::PRE_SEND_STATUS)) {
      Report(methods->GetSendStatus().error_code());
    }
    methods->Proceed();
  }

 private:
  void Report(grpc::StatusCode code) {
    reported_ = true;
    std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start_;
    (*observer_)(method_, absl::StatusCodeToString(static_cast<absl::StatusCode>(code)),
                 elapsed.count());
  }

  const std::string method_;
  const RpcObserver* const observer_;  // owned by the factory
  const std::chrono::steady_clock::time_point start_;
  bool reported_ = false;  // hook points of one call run sequentially
};

class RpcMetricsInterceptorFactory final : public exp::ServerInterceptorFactoryInterface {
 public:
  explicit RpcMetricsInterceptorFactory(RpcObserver observer)
      : observer_(std::move(observer)) {}

  exp::Interceptor* CreateServerInterceptor(exp::ServerRpcInfo* info) override {
    // gRPC's API: the caller takes ownership of the returned interceptor.
    return new RpcMetricsInterceptor(info, &observer_);
  }

 private:
  const RpcObserver observer_;
};

}  // namespace

std::vector<std::unique_ptr<exp::ServerInterceptorFactoryInterface>>
MakeRpcMetricsInterceptors(RpcObserver observer) {
  std::vector<std::unique_ptr<exp::ServerInterceptorFactoryInterface>> out;
  if (observer) {
    out.push_back(std::make_unique<RpcMetricsInterceptorFactory>(std::move(observer)));
  }
  return out;
}

}  // namespace depthbench::scheduler
