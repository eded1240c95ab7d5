// TLS and the shared token on the real binaries. Each test makes a
// self-signed certificate (for IP 127.0.0.1 and localhost) with the openssl
// CLI in a temp dir, starts depthbench-scheduler on a loopback port with
// --tls-cert/--tls-key/--auth-token-file over a temp SQLite file, and talks
// to it the ways a user does: gRPC clients, the depthbench CLI with
// --tls-ca, and a depthbench-worker with --tls-ca (running a stand-in
// trainer, testdata/fake_trainer.sh, so no LibTorch build is needed).
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "depthbench/v1/sweep_service.grpc.pb.h"
#include "depthbench/v1/worker_service.grpc.pb.h"
#include "tests/integration/metrics_scrape.h"
#include "tests/integration/scheduler_process.h"
#include "tests/integration/sweep_fixture.h"
#include "tests/integration/worker_process.h"

namespace depthbench::testing {
namespace {

namespace v1 = ::depthbench::v1;

constexpr char kToken[] = "tls-test-token";

// The openssl executable on PATH; empty when there is none.
std::string FindOpenssl() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    std::string candidate = dir + "/openssl";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteAll(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

class SchedulerTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string openssl = FindOpenssl();
    if (openssl.empty()) {
      GTEST_SKIP() << "openssl not found on PATH: cannot make a test certificate "
                      "(scripts/setup.sh installs the Debian package openssl)";
    }
    dir_ = MakeTempDir(std::string("tls_") +
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    cert_ = dir_ + "/cert.pem";
    other_cert_ = dir_ + "/other.pem";
    token_file_ = dir_ + "/token";
    WriteAll(token_file_, std::string(kToken) + "\n");
    ASSERT_NO_FATAL_FAILURE(MakeCertificate(openssl, cert_, dir_ + "/key.pem"));
    // A second, unrelated certificate: a root the server's does not chain to.
    ASSERT_NO_FATAL_FAILURE(MakeCertificate(openssl, other_cert_, dir_ + "/other-key.pem"));
    cert_pem_ = ReadAll(cert_);
    scheduler_ = std::make_unique<SchedulerProcess>(
        dir_ + "/sched.db", dir_,
        std::vector<std::string>{"--tls-cert", cert_, "--tls-key", dir_ + "/key.pem",
                                 "--auth-token-file", token_file_});
    ASSERT_TRUE(scheduler_->Start()) << ReadAll(dir_ + "/scheduler.log");
  }

  void TearDown() override {
    scheduler_.reset();
    if (!dir_.empty() && !HasFailure()) std::filesystem::remove_all(dir_);
  }

  static void MakeCertificate(const std::string& openssl, const std::string& cert,
                              const std::string& key) {
    auto [rc, out] = RunCommand(
        openssl + " req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
                  "-days 1 -subj /CN=localhost "
                  "-addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout " +
        key + " -out " + cert + " 2>&1");
    ASSERT_EQ(rc, 0) << out;
  }

  std::shared_ptr<grpc::Channel> TlsChannel(const std::string& root_pem) const {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = root_pem;
    return grpc::CreateChannel(scheduler_->address(), grpc::SslCredentials(ssl));
  }
  std::shared_ptr<grpc::Channel> PlaintextChannel() const {
    return grpc::CreateChannel(scheduler_->address(), grpc::InsecureChannelCredentials());
  }
  static std::unique_ptr<grpc::ClientContext> Authorized(const std::string& token,
                                                         int ms = 5000) {
    auto ctx = Ctx(ms);
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    return ctx;
  }

  std::string dir_, cert_, other_cert_, token_file_, cert_pem_;
  std::unique_ptr<SchedulerProcess> scheduler_;
};

TEST_F(SchedulerTlsTest, TlsClientTrustingTheCertificateWithTheTokenSucceeds) {
  auto sweeps = v1::SweepService::NewStub(TlsChannel(cert_pem_));
  v1::SubmitSweepRequest submit;
  *submit.mutable_spec() = OneJobSpec("tls");
  v1::SubmitSweepResponse submitted;
  grpc::Status status = sweeps->SubmitSweep(Authorized(kToken).get(), submit, &submitted);
  ASSERT_TRUE(status.ok()) << status.error_code() << " " << status.error_message();
  EXPECT_TRUE(submitted.created());
  EXPECT_EQ(submitted.sweep().total_jobs(), 1);

  auto workers = v1::WorkerService::NewStub(TlsChannel(cert_pem_));
  v1::RegisterWorkerRequest reg;
  reg.set_name("w");
  v1::RegisterWorkerResponse registered;
  status = workers->RegisterWorker(Authorized(kToken).get(), reg, &registered);
  ASSERT_TRUE(status.ok()) << status.error_message();
  v1::AcquireJobRequest acquire;
  acquire.set_worker_id("w");
  v1::AcquireJobResponse lease;
  status = workers->AcquireJob(Authorized(kToken).get(), acquire, &lease);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(lease.has_job());
}

// /readyz probes the gRPC port over a fresh connection (issue 20); with TLS
// the probe does the TLS handshake itself and needs no token.
TEST_F(SchedulerTlsTest, ReadinessProbesTheTlsPort) {
  const std::string sub = dir_ + "/ready";
  std::filesystem::create_directories(sub);
  SchedulerProcess ready(sub + "/s.db", sub,
                         {"--tls-cert", cert_, "--tls-key", dir_ + "/key.pem",
                          "--auth-token-file", token_file_, "--metrics-listen", "127.0.0.1:0",
                          "--metrics-port-file", sub + "/mport"});
  ASSERT_TRUE(ready.Start()) << ReadAll(sub + "/scheduler.log");
  int mport = 0;
  std::ifstream(sub + "/mport") >> mport;
  ASSERT_GT(mport, 0);
  HttpResponse response = HttpGet(mport, "/readyz");
  EXPECT_EQ(response.status, 200) << response.body << ReadAll(sub + "/scheduler.log");
}

TEST_F(SchedulerTlsTest, WrongOrMissingTokenOverTlsIsUnauthenticated) {
  auto sweeps = v1::SweepService::NewStub(TlsChannel(cert_pem_));
  v1::ListSweepsResponse listed;
  grpc::Status wrong = sweeps->ListSweeps(Authorized("not-the-token").get(), {}, &listed);
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED) << wrong.error_message();
  grpc::Status missing = sweeps->ListSweeps(Authorized("").get(), {}, &listed);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED) << missing.error_message();

  auto workers = v1::WorkerService::NewStub(TlsChannel(cert_pem_));
  v1::RegisterWorkerRequest reg;
  reg.set_name("w");
  v1::RegisterWorkerResponse registered;
  grpc::Status worker = workers->RegisterWorker(Authorized("nope").get(), reg, &registered);
  EXPECT_EQ(worker.error_code(), grpc::StatusCode::UNAUTHENTICATED) << worker.error_message();

  // The connection itself is fine: the right token on the same channel works.
  grpc::Status right = sweeps->ListSweeps(Authorized(kToken).get(), {}, &listed);
  EXPECT_TRUE(right.ok()) << right.error_message();
}

TEST_F(SchedulerTlsTest, PlaintextClientIsRefused) {
  auto sweeps = v1::SweepService::NewStub(PlaintextChannel());
  v1::ListSweepsResponse listed;
  grpc::Status status = sweeps->ListSweeps(Authorized(kToken, 3000).get(), {}, &listed);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
}

TEST_F(SchedulerTlsTest, ClientNotTrustingTheCertificateIsRefused) {
  auto sweeps = v1::SweepService::NewStub(TlsChannel(ReadAll(other_cert_)));
  v1::ListSweepsResponse listed;
  grpc::Status status = sweeps->ListSweeps(Authorized(kToken, 3000).get(), {}, &listed);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
}

TEST_F(SchedulerTlsTest, CliConnectsWithTlsCa) {
  std::string spec = dir_ + "/spec.yaml";
  WriteAll(spec,
           "name: cli-tls\narchitectures: [pre_ln]\nshapes: {explicit: [2x64]}\n"
           "lr_grids: {pre_ln: [0.001]}\ntraining: {steps: 1}\n");
  std::string bad_token = dir_ + "/bad-token";
  WriteAll(bad_token, "wrong\n");
  std::string cli = std::string(DEPTHBENCH_CLI_BIN) + " --scheduler " + scheduler_->address() +
                    " --timeout-ms 3000";

  auto [rc, out] = RunCommand(cli + " --tls-ca " + cert_ + " --token-file " + token_file_ +
                              " submit " + spec + " 2>&1");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("sweep cli-tls: 1 jobs submitted"), std::string::npos) << out;

  std::tie(rc, out) = RunCommand(cli + " --tls-ca " + cert_ + " --token-file " + bad_token +
                                 " sweeps 2>&1");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("[UNAUTHENTICATED]"), std::string::npos) << out;

  std::tie(rc, out) = RunCommand(cli + " --token-file " + token_file_ + " sweeps 2>&1");
  EXPECT_EQ(rc, 1) << out;  // no --tls-ca: plaintext to a TLS port
  EXPECT_NE(out.find("[UNAVAILABLE]"), std::string::npos) << out;

  std::tie(rc, out) = RunCommand(cli + " --tls-ca " + token_file_ + " --token-file " +
                                 token_file_ + " sweeps 2>&1");
  EXPECT_EQ(rc, 2) << out;  // not a certificate: bad usage, said before connecting
  EXPECT_NE(out.find("--tls-ca: " + token_file_ + " holds no PEM certificate"),
            std::string::npos)
      << out;
}

TEST_F(SchedulerTlsTest, WorkerRunsAJobOverTls) {
  auto sweeps = v1::SweepService::NewStub(TlsChannel(cert_pem_));
  v1::SubmitSweepRequest submit;
  *submit.mutable_spec() = OneJobSpec("worker-tls");
  v1::SubmitSweepResponse submitted;
  grpc::Status status = sweeps->SubmitSweep(Authorized(kToken).get(), submit, &submitted);
  ASSERT_TRUE(status.ok()) << status.error_message();

  WorkerProcess worker("tls-worker", dir_);
  worker.Start(scheduler_->address(), dir_ + "/ckpt",
               {"--tls-ca", cert_, "--auth-token-file", token_file_});
  v1::Sweep sweep;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    v1::GetSweepRequest get;
    get.set_name("worker-tls");
    status = sweeps->GetSweep(Authorized(kToken).get(), get, &sweep);
    ASSERT_TRUE(status.ok()) << status.error_message();
  } while (sweep.done_jobs() < sweep.total_jobs() && std::chrono::steady_clock::now() < deadline);
  ASSERT_EQ(sweep.done_jobs(), 1) << worker.ReadLog();

  v1::ListJobsRequest list;
  list.set_sweep("worker-tls");
  v1::ListJobsResponse jobs;
  ASSERT_TRUE(sweeps->ListJobs(Authorized(kToken).get(), list, &jobs).ok());
  ASSERT_EQ(jobs.jobs_size(), 1);
  v1::GetJobRequest get_job;
  get_job.set_job_id(jobs.jobs(0).id());
  v1::Job job;
  ASSERT_TRUE(sweeps->GetJob(Authorized(kToken).get(), get_job, &job).ok());
  EXPECT_EQ(job.state(), v1::SUCCEEDED) << job.reason() << "\n" << worker.ReadLog();
  EXPECT_DOUBLE_EQ(job.final_val_loss(), 2.5);  // from the stand-in trainer's done event
  ASSERT_EQ(job.attempts_size(), 1);
  EXPECT_EQ(job.attempts(0).worker_id(), "tls-worker");
  EXPECT_EQ(worker.Stop(SIGTERM), 0);  // exit status 0: a clean shutdown
}

TEST_F(SchedulerTlsTest, WorkerRefusesATlsCaThatIsNotACertificate) {
  auto [rc, out] = RunCommand(std::string(DEPTHBENCH_WORKER_BIN) + " --scheduler " +
                              scheduler_->address() + " --checkpoint-root " + dir_ +
                              "/ckpt --train-binary " + DEPTHBENCH_TRAIN_BIN + " --tls-ca " +
                              token_file_ + " 2>&1");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--tls-ca: " + token_file_ + " holds no PEM certificate"),
            std::string::npos)
      << out;
}

}  // namespace
}  // namespace depthbench::testing
