#include "common/daemon_metrics.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/metric_names.h"
#include "common/status_macros.h"

namespace depthbench {
namespace {

std::vector<std::string> SpecLabels(const MetricSpec& spec) {
  std::vector<std::string> labels;
  if (spec.labels[0] == '\0') return labels;
  for (absl::string_view part : absl::StrSplit(spec.labels, ',')) {
    labels.emplace_back(part.data(), part.size());
  }
  return labels;
}

absl::StatusOr<const MetricSpec*> Spec(const char* name, const char* type) {
  const MetricSpec* spec = FindMetricSpec(name);
  if (spec == nullptr || std::strcmp(spec->type, type) != 0) {
    return absl::InternalError(absl::StrCat(
        "metric_names.h has no ", std::string(type), " named ",
        std::string(name)));
  }
  return spec;
}

absl::StatusOr<CounterFamily*> AddCounterFamily(MetricsRegistry* registry,
                                                const char* name) {
  ASSIGN_OR_RETURN(const MetricSpec* spec, Spec(name, "counter"));
  return registry->AddCounter(spec->name, spec->help, SpecLabels(*spec));
}

absl::StatusOr<Counter*> AddCounter(MetricsRegistry* registry,
                                    const char* name) {
  ASSIGN_OR_RETURN(CounterFamily * family, AddCounterFamily(registry, name));
  return &family->WithLabelValues({});
}

absl::StatusOr<GaugeFamily*> AddGaugeFamily(MetricsRegistry* registry,
                                            const char* name) {
  ASSIGN_OR_RETURN(const MetricSpec* spec, Spec(name, "gauge"));
  return registry->AddGauge(spec->name, spec->help, SpecLabels(*spec));
}

absl::StatusOr<Gauge*> AddGauge(MetricsRegistry* registry, const char* name) {
  ASSIGN_OR_RETURN(GaugeFamily * family, AddGaugeFamily(registry, name));
  return &family->WithLabelValues({});
}

absl::StatusOr<HistogramFamily*> AddLatencyHistogram(MetricsRegistry* registry,
                                                     const char* name) {
  ASSIGN_OR_RETURN(const MetricSpec* spec, Spec(name, "histogram"));
  return registry->AddHistogram(spec->name, spec->help, SpecLabels(*spec),
                                DefaultLatencyBuckets());
}

absl::Status AddBuildInfo(MetricsRegistry* registry, const char* component,
                          const std::string& version) {
  ASSIGN_OR_RETURN(GaugeFamily * info, AddGaugeFamily(registry, kBuildInfo));
  info->WithLabelValues({component, version}).Set(1);
  return absl::OkStatus();
}

}  // namespace

const MetricSpec* FindMetricSpec(const std::string& name) {
  for (const MetricSpec& spec : kMetricSpecs) {
    if (name == spec.name) return &spec;
  }
  return nullptr;
}

std::vector<std::string> AllExportedSeriesNames() {
  std::vector<std::string> names;
  for (const MetricSpec& spec : kMetricSpecs) {
    const std::string name = spec.name;
    names.push_back(name);
    if (std::strcmp(spec.type, "histogram") == 0) {
      names.push_back(name + "_bucket");
      names.push_back(name + "_sum");
      names.push_back(name + "_count");
    }
  }
  return names;
}

void SchedulerMetrics::RecordRpc(const std::string& method,
                                 const std::string& code,
                                 double seconds) const {
  rpcs->WithLabelValues({method, code}).Increment();
  rpc_duration->WithLabelValues({method, code}).Observe(seconds);
}

absl::StatusOr<SchedulerMetrics> RegisterSchedulerMetrics(
    MetricsRegistry* registry, const std::string& version,
    CollectCallback jobs_by_sweep_and_state) {
  SchedulerMetrics m;
  RETURN_IF_ERROR(AddBuildInfo(registry, "scheduler", version));
  {
    ASSIGN_OR_RETURN(const MetricSpec* spec, Spec(kSchedulerJobs, "gauge"));
    RETURN_IF_ERROR(registry->AddCollectedFamily(
        MetricType::kGauge, spec->name, spec->help, SpecLabels(*spec),
        std::move(jobs_by_sweep_and_state)));
  }
  ASSIGN_OR_RETURN(m.jobs_finished,
                   AddCounterFamily(registry, kSchedulerJobsFinished));
  ASSIGN_OR_RETURN(m.leases_granted,
                   AddCounter(registry, kSchedulerLeasesGranted));
  ASSIGN_OR_RETURN(m.leases_expired,
                   AddCounter(registry, kSchedulerLeasesExpired));
  ASSIGN_OR_RETURN(m.job_retries,
                   AddCounterFamily(registry, kSchedulerJobRetries));
  ASSIGN_OR_RETURN(m.rpcs, AddCounterFamily(registry, kSchedulerRpcs));
  ASSIGN_OR_RETURN(m.rpc_duration,
                   AddLatencyHistogram(registry, kSchedulerRpcDuration));
  ASSIGN_OR_RETURN(m.metric_points_ingested,
                   AddCounter(registry, kSchedulerMetricPointsIngested));
  ASSIGN_OR_RETURN(m.metric_points_duplicate,
                   AddCounter(registry, kSchedulerMetricPointsDuplicate));
  ASSIGN_OR_RETURN(
      m.sqlite_transaction_duration,
      AddLatencyHistogram(registry, kSchedulerSqliteTransactionDuration));
  ASSIGN_OR_RETURN(m.workers_connected,
                   AddGauge(registry, kSchedulerWorkersConnected));
  return m;
}

void WorkerMetrics::SetSlots(int busy, int free) const {
  slots->WithLabelValues({"busy"}).Set(busy);
  slots->WithLabelValues({"free"}).Set(free);
}

void WorkerMetrics::RecordStep(const JobLabels& job, int64_t step, double loss,
                               double tokens_per_second) const {
  const std::vector<std::string> values = job.Values();
  job_step->WithLabelValues(values).Set(static_cast<double>(step));
  job_training_loss->WithLabelValues(values).Set(loss);
  job_tokens_per_second->WithLabelValues(values).Set(tokens_per_second);
}

void WorkerMetrics::RecordEval(const JobLabels& job, double val_loss) const {
  job_validation_loss->WithLabelValues(job.Values()).Set(val_loss);
}

void WorkerMetrics::RecordCheckpoint(double seconds) const {
  checkpoint_duration->Observe(seconds);
}

void WorkerMetrics::RemoveJob(const JobLabels& job) const {
  const std::vector<std::string> values = job.Values();
  job_step->Remove(values);
  job_training_loss->Remove(values);
  job_validation_loss->Remove(values);
  job_tokens_per_second->Remove(values);
}

absl::StatusOr<WorkerMetrics> RegisterWorkerMetrics(
    MetricsRegistry* registry, const std::string& version,
    std::function<double()> heartbeat_age_seconds) {
  WorkerMetrics m;
  RETURN_IF_ERROR(AddBuildInfo(registry, "worker", version));
  ASSIGN_OR_RETURN(m.slots, AddGaugeFamily(registry, kWorkerSlots));
  m.SetSlots(0, 0);
  ASSIGN_OR_RETURN(m.job_training_loss,
                   AddGaugeFamily(registry, kWorkerJobTrainingLoss));
  ASSIGN_OR_RETURN(m.job_validation_loss,
                   AddGaugeFamily(registry, kWorkerJobValidationLoss));
  ASSIGN_OR_RETURN(m.job_tokens_per_second,
                   AddGaugeFamily(registry, kWorkerJobTokensPerSecond));
  ASSIGN_OR_RETURN(m.job_step, AddGaugeFamily(registry, kWorkerJobStep));
  ASSIGN_OR_RETURN(m.child_restarts,
                   AddCounter(registry, kWorkerChildRestarts));
  ASSIGN_OR_RETURN(m.relay_backlog_points,
                   AddGauge(registry, kWorkerRelayBacklog));
  {
    // Checkpoints of small runs take milliseconds, of a 400M model with its
    // AdamW state (~5 GB) tens of seconds: 10 ms .. ~160 s.
    ASSIGN_OR_RETURN(const MetricSpec* spec, Spec(kWorkerCheckpointDuration, "histogram"));
    ASSIGN_OR_RETURN(HistogramFamily * family,
                     registry->AddHistogram(spec->name, spec->help, SpecLabels(*spec),
                                            ExponentialBuckets(0.01, 2, 15)));
    m.checkpoint_duration = &family->WithLabelValues({});
  }
  {
    ASSIGN_OR_RETURN(const MetricSpec* spec,
                     Spec(kWorkerLastHeartbeatAge, "gauge"));
    RETURN_IF_ERROR(registry->AddCollectedGauge(
        spec->name, spec->help, std::move(heartbeat_age_seconds)));
  }
  return m;
}

}  // namespace depthbench
