// Helpers shared by the scheduler tests.
#ifndef DEPTHBENCH_TESTS_SCHEDULER_TEST_UTIL_H_
#define DEPTHBENCH_TESTS_SCHEDULER_TEST_UTIL_H_

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "depthbench/v1/spec.pb.h"
#include "depthbench/v1/worker_service.pb.h"
#include "scheduler/scheduler.h"

namespace depthbench::testing {

// A path for a fresh SQLite file `name` in this process's temp folder, with
// any file (and its -wal/-shm companions) a previous run left there removed.
inline std::string TempDb(const std::string& name) {
  std::string dir = std::filesystem::temp_directory_path() /
                    ("db_scheduler_tests_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::string path = dir + "/" + name;
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
  return path;
}

// Registers worker `name` with `slots` slots (asserts success).
inline void RegisterWorker(depthbench::scheduler::Scheduler& scheduler, const std::string& name,
                           int slots = 4) {
  depthbench::v1::RegisterWorkerRequest req;
  req.set_name(name);
  req.mutable_resources()->set_slots(slots);
  ASSERT_TRUE(scheduler.RegisterWorker(req).ok());
}

// AcquireJob for `worker`; an empty response (and a test failure) on error.
inline depthbench::v1::AcquireJobResponse AcquireFor(depthbench::scheduler::Scheduler& scheduler,
                                                     const std::string& worker) {
  depthbench::v1::AcquireJobRequest req;
  req.set_worker_id(worker);
  auto r = scheduler.AcquireJob(req);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : depthbench::v1::AcquireJobResponse();
}

// One explicit 2x64 shape, the given archs and LR grid (per arch), one seed.
inline depthbench::v1::SweepSpec SmallSpec(const std::string& name,
                                           std::vector<std::string> archs,
                                           std::vector<double> lrs) {
  depthbench::v1::SweepSpec spec;
  spec.set_name(name);
  for (const auto& a : archs) {
    spec.add_architectures(a);
    auto& grid = (*spec.mutable_lr_grids())[a];
    for (double lr : lrs) grid.add_lrs(lr);
  }
  auto* shape = spec.mutable_shapes()->add_explicit_shapes();
  shape->set_layers(2);
  shape->set_d_model(64);
  spec.mutable_training()->set_steps(10);
  spec.mutable_training()->set_seq_len(32);
  spec.mutable_retry()->set_max_attempts(3);
  spec.mutable_retry()->set_initial_backoff_ms(1000);
  spec.mutable_retry()->set_backoff_multiplier(2.0);
  spec.mutable_retry()->set_max_backoff_ms(60000);
  return spec;
}

}  // namespace depthbench::testing

#endif  // DEPTHBENCH_TESTS_SCHEDULER_TEST_UTIL_H_
