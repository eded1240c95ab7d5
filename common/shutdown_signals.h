// The daemons' shutdown signals: SIGINT and SIGTERM blocked in every thread
// (threads started later inherit the mask; ChildProcess::Spawn gives
// children an empty mask back), so one thread can wait for them with
// sigwait(&BlockShutdownSignals(), ...) and shut down in order.
//
// Call early in main(), before any thread starts.
#ifndef DEPTHBENCH_COMMON_SHUTDOWN_SIGNALS_H_
#define DEPTHBENCH_COMMON_SHUTDOWN_SIGNALS_H_

#include <pthread.h>
#include <signal.h>

namespace depthbench {

inline sigset_t BlockShutdownSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

}  // namespace depthbench

#endif  // DEPTHBENCH_COMMON_SHUTDOWN_SIGNALS_H_
