#include "common/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/metric_names.h"
#include "common/prometheus_text.h"

namespace depthbench {
namespace {

void AtomicAdd(std::atomic<double>* target, double delta) {
  double current = target->load(std::memory_order_relaxed);
  while (!target->compare_exchange_weak(current, current + delta,
                                        std::memory_order_relaxed)) {
  }
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A family whose samples a callback produces at scrape time.
class CollectedFamily final : public MetricFamilyBase {
 public:
  CollectedFamily(std::string name, std::string help, MetricType type,
                  std::vector<std::string> label_names, CollectCallback collect)
      : MetricFamilyBase(std::move(name), std::move(help), type,
                         std::move(label_names)),
        collect_(std::move(collect)) {}

  absl::Status AppendTo(std::string* out) const override {
    absl::StatusOr<std::vector<CollectedSample>> samples = collect_();
    if (!samples.ok()) {
      return absl::Status(samples.status().code(),
                          absl::StrCat(name(), ": ", samples.status().message()));
    }
    // Validate before appending anything, so a bad callback cannot produce
    // a malformed exposition.
    std::sort(samples->begin(), samples->end(),
              [](const CollectedSample& a, const CollectedSample& b) {
                return a.label_values < b.label_values;
              });
    for (size_t i = 0; i < samples->size(); ++i) {
      const CollectedSample& s = (*samples)[i];
      if (s.label_values.size() != label_names().size()) {
        return absl::InternalError(absl::StrCat(
            name(), ": collected sample has ", s.label_values.size(),
            " label values, family has ", label_names().size(), " labels"));
      }
      if (i > 0 && (*samples)[i - 1].label_values == s.label_values) {
        return absl::InternalError(
            absl::StrCat(name(), ": collected duplicate label set"));
      }
    }
    AppendHeader(out);
    for (const CollectedSample& s : *samples) {
      AppendSampleLine(name(), label_names(), s.label_values, nullptr, "",
                       s.value, out);
    }
    return absl::OkStatus();
  }

 private:
  const CollectCallback collect_;
};

}  // namespace

const char* MetricTypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

void Counter::Increment(double delta) {
  if (!(delta >= 0)) return;  // also rejects NaN
  AtomicAdd(&value_, delta);
}

void Gauge::Increment(double delta) { AtomicAdd(&value_, delta); }

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)),
      counts_(new std::atomic<uint64_t>[upper_bounds_.size() + 1]) {
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) counts_[i].store(0);
}

void Histogram::Observe(double value) {
  size_t bucket = upper_bounds_.size();  // +Inf (also for NaN)
  if (!std::isnan(value)) {
    // First bound >= value: `le` buckets are inclusive.
    bucket = std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(),
                              value) -
             upper_bounds_.begin();
  }
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(&sum_, value);
}

HistogramSnapshot Histogram::Snapshot() const {
  HistogramSnapshot snap;
  snap.upper_bounds = upper_bounds_;
  snap.cumulative.resize(upper_bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    snap.cumulative[i] = running;
  }
  snap.count = running;
  snap.sum = sum_.load(std::memory_order_relaxed);
  return snap;
}

std::vector<double> ExponentialBuckets(double start, double factor,
                                       int count) {
  std::vector<double> bounds;
  double bound = start;
  for (int i = 0; i < count; ++i) {
    bounds.push_back(bound);
    bound *= factor;
  }
  return bounds;
}

std::vector<double> LinearBuckets(double start, double width, int count) {
  std::vector<double> bounds;
  for (int i = 0; i < count; ++i) bounds.push_back(start + width * i);
  return bounds;
}

std::vector<double> DefaultLatencyBuckets() {
  return ExponentialBuckets(0.0005, 2.0, 16);  // 0.5 ms .. 16.4 s
}

ScopedHistogramTimer::~ScopedHistogramTimer() {
  const std::chrono::duration<double> elapsed =
      std::chrono::steady_clock::now() - start_;
  histogram_->Observe(elapsed.count());
}

void MetricFamilyBase::CheckLabelCount(
    const std::vector<std::string>& values) const {
  if (values.size() == label_names_.size()) return;
  std::fprintf(stderr,
               "FATAL metrics: %s takes %zu label values, %zu were given\n",
               name_.c_str(), label_names_.size(), values.size());
  std::abort();
}

void MetricFamilyBase::AppendHeader(std::string* out) const {
  out->append("# HELP ");
  out->append(name_);
  out->push_back(' ');
  AppendEscapedHelp(help_, out);
  out->append("\n# TYPE ");
  out->append(name_);
  out->push_back(' ');
  out->append(MetricTypeName(type_));
  out->push_back('\n');
}

void AppendSampleLine(const std::string& name,
                      const std::vector<std::string>& label_names,
                      const std::vector<std::string>& label_values,
                      const char* extra_label, const std::string& extra_value,
                      double value, std::string* out) {
  out->append(name);
  if (!label_names.empty() || extra_label != nullptr) {
    out->push_back('{');
    bool first = true;
    for (size_t i = 0; i < label_names.size(); ++i) {
      if (!first) out->push_back(',');
      first = false;
      out->append(label_names[i]);
      out->append("=\"");
      AppendEscapedLabelValue(label_values[i], out);
      out->push_back('"');
    }
    if (extra_label != nullptr) {
      if (!first) out->push_back(',');
      out->append(extra_label);
      out->append("=\"");
      AppendEscapedLabelValue(extra_value, out);
      out->push_back('"');
    }
    out->push_back('}');
  }
  out->push_back(' ');
  AppendSampleValue(value, out);
  out->push_back('\n');
}

void AppendChildSamples(const MetricFamilyBase& family,
                        const std::vector<std::string>& values,
                        const Counter& child, std::string* out) {
  AppendSampleLine(family.name(), family.label_names(), values, nullptr, "",
                   child.Value(), out);
}

void AppendChildSamples(const MetricFamilyBase& family,
                        const std::vector<std::string>& values,
                        const Gauge& child, std::string* out) {
  AppendSampleLine(family.name(), family.label_names(), values, nullptr, "",
                   child.Value(), out);
}

void AppendChildSamples(const MetricFamilyBase& family,
                        const std::vector<std::string>& values,
                        const Histogram& child, std::string* out) {
  const HistogramSnapshot snap = child.Snapshot();
  const std::string bucket_name = family.name() + "_bucket";
  for (size_t i = 0; i < snap.cumulative.size(); ++i) {
    const std::string le = i < snap.upper_bounds.size()
                               ? FormatSampleValue(snap.upper_bounds[i])
                               : std::string("+Inf");
    AppendSampleLine(bucket_name, family.label_names(), values, "le", le,
                     static_cast<double>(snap.cumulative[i]), out);
  }
  AppendSampleLine(family.name() + "_sum", family.label_names(), values,
                   nullptr, "", snap.sum, out);
  AppendSampleLine(family.name() + "_count", family.label_names(), values,
                   nullptr, "", static_cast<double>(snap.count), out);
}

MetricsRegistry::MetricsRegistry() {
  std::string help;
  for (const MetricSpec& spec : kMetricSpecs) {
    if (std::string(spec.name) == kMetricsCollectErrors) help = spec.help;
  }
  absl::StatusOr<CounterFamily*> errors =
      AddCounter(kMetricsCollectErrors, help, {"family"});
  collect_errors_ = *errors;  // a constant, valid name: cannot fail
}

absl::Status MetricsRegistry::CheckNewFamily(
    const std::string& name, MetricType type,
    const std::vector<std::string>& label_names) {
  if (!IsValidMetricName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid metric name \"", name, "\""));
  }
  if (type == MetricType::kCounter && !EndsWith(name, "_total")) {
    return absl::InvalidArgumentError(
        absl::StrCat("counter name \"", name, "\" must end in _total"));
  }
  if (type != MetricType::kCounter && EndsWith(name, "_total")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "only counter names end in _total, \"", name, "\" is not a counter"));
  }
  std::set<std::string> seen;
  for (const std::string& label : label_names) {
    if (!IsValidLabelName(label)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metric \"", name, "\": invalid label name \"", label, "\""));
    }
    if (type == MetricType::kHistogram && label == "le") {
      return absl::InvalidArgumentError(absl::StrCat(
          "histogram \"", name, "\": label name \"le\" is reserved"));
    }
    if (!seen.insert(label).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metric \"", name, "\": duplicate label name \"", label, "\""));
    }
  }
  std::vector<std::string> claimed = {name};
  if (type == MetricType::kHistogram) {
    claimed = {name, name + "_bucket", name + "_sum", name + "_count"};
  }
  for (const std::string& sample_name : claimed) {
    auto it = sample_names_.find(sample_name);
    if (it != sample_names_.end()) {
      return absl::AlreadyExistsError(
          absl::StrCat("metric name \"", sample_name,
                       "\" is already used by family \"", it->second, "\""));
    }
  }
  for (const std::string& sample_name : claimed) {
    sample_names_[sample_name] = name;
  }
  return absl::OkStatus();
}

template <typename F>
F* MetricsRegistry::Insert(std::unique_ptr<F> family) {
  F* raw = family.get();
  families_[family->name()] = std::move(family);
  return raw;
}

absl::StatusOr<CounterFamily*> MetricsRegistry::AddCounter(
    const std::string& name, const std::string& help,
    std::vector<std::string> label_names) {
  absl::MutexLock lock(&mu_);
  absl::Status status = CheckNewFamily(name, MetricType::kCounter, label_names);
  if (!status.ok()) return status;
  return Insert(std::make_unique<CounterFamily>(
      name, help, MetricType::kCounter, std::move(label_names),
      [] { return std::make_unique<Counter>(); }));
}

absl::StatusOr<GaugeFamily*> MetricsRegistry::AddGauge(
    const std::string& name, const std::string& help,
    std::vector<std::string> label_names) {
  absl::MutexLock lock(&mu_);
  absl::Status status = CheckNewFamily(name, MetricType::kGauge, label_names);
  if (!status.ok()) return status;
  return Insert(std::make_unique<GaugeFamily>(
      name, help, MetricType::kGauge, std::move(label_names),
      [] { return std::make_unique<Gauge>(); }));
}

absl::StatusOr<HistogramFamily*> MetricsRegistry::AddHistogram(
    const std::string& name, const std::string& help,
    std::vector<std::string> label_names, std::vector<double> upper_bounds) {
  if (upper_bounds.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("histogram \"", name, "\" needs at least one bucket"));
  }
  for (size_t i = 0; i < upper_bounds.size(); ++i) {
    if (!std::isfinite(upper_bounds[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "histogram \"", name,
          "\": bucket bounds must be finite (+Inf is implicit)"));
    }
    if (i > 0 && !(upper_bounds[i - 1] < upper_bounds[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "histogram \"", name, "\": bucket bounds must strictly ascend"));
    }
  }
  absl::MutexLock lock(&mu_);
  absl::Status status =
      CheckNewFamily(name, MetricType::kHistogram, label_names);
  if (!status.ok()) return status;
  return Insert(std::make_unique<HistogramFamily>(
      name, help, MetricType::kHistogram, std::move(label_names),
      [bounds = std::move(upper_bounds)] {
        return std::make_unique<Histogram>(bounds);
      }));
}

absl::Status MetricsRegistry::AddCollectedFamily(
    MetricType type, const std::string& name, const std::string& help,
    std::vector<std::string> label_names, CollectCallback collect) {
  if (type == MetricType::kHistogram) {
    return absl::InvalidArgumentError(absl::StrCat(
        "collected family \"", name, "\" must be a counter or a gauge"));
  }
  if (collect == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("collected family \"", name, "\" has no callback"));
  }
  absl::MutexLock lock(&mu_);
  absl::Status status = CheckNewFamily(name, type, label_names);
  if (!status.ok()) return status;
  Insert(std::make_unique<CollectedFamily>(name, help, type,
                                           std::move(label_names),
                                           std::move(collect)));
  // Exported at 0 from the start, so that increase()/rate() (and the
  // DepthbenchMetricsCollectErrors alert) see the first error.
  collect_errors_->WithLabelValues({name});
  return absl::OkStatus();
}

absl::Status MetricsRegistry::AddCollectedGauge(
    const std::string& name, const std::string& help,
    std::function<double()> value_fn) {
  if (value_fn == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("collected gauge \"", name, "\" has no callback"));
  }
  return AddCollectedFamily(
      MetricType::kGauge, name, help, {},
      [fn = std::move(value_fn)]()
          -> absl::StatusOr<std::vector<CollectedSample>> {
        return std::vector<CollectedSample>{{{}, fn()}};
      });
}

std::string MetricsRegistry::Render() const {
  std::vector<const MetricFamilyBase*> families;
  {
    absl::MutexLock lock(&mu_);
    families.reserve(families_.size());
    for (const auto& [name, family] : families_) families.push_back(family.get());
  }
  std::string out;
  // Reserving the previous scrape's size avoids regrowing (and page-faulting)
  // a buffer of hundreds of KiB on every scrape.
  out.reserve(last_render_bytes_.load(std::memory_order_relaxed) + 4096);
  for (const MetricFamilyBase* family : families) {
    if (family == collect_errors_) continue;  // rendered last, see below
    const size_t mark = out.size();
    absl::Status status = family->AppendTo(&out);
    if (!status.ok()) {
      out.resize(mark);  // drop anything partial
      collect_errors_->WithLabelValues({family->name()}).Increment();
    }
  }
  // Last, so that errors found during this very scrape are included.
  // Output stays valid (each family's lines are contiguous), only the
  // order departs from the alphabetical one here.
  collect_errors_->AppendTo(&out).IgnoreError();
  last_render_bytes_.store(out.size(), std::memory_order_relaxed);
  return out;
}

size_t MetricsRegistry::family_count() const {
  absl::MutexLock lock(&mu_);
  return families_.size();
}

}  // namespace depthbench
