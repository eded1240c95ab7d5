// A small Prometheus metrics registry: counters, gauges and histograms, each
// a family of children keyed by label values, plus "collect-on-scrape"
// families whose samples a callback computes at scrape time (e.g. jobs by
// state read from SQLite). Render() produces the text exposition format
// 0.0.4 that MetricsHttpServer (common/metrics_http_server.h) serves.
//
// Why not prometheus-cpp: it is not packaged for Debian 12, and the project
// builds from Debian packages only; the subset needed here is small.
//
// Usage:
//   MetricsRegistry registry;
//   ASSIGN_OR_RETURN(CounterFamily* rpcs,
//                    registry.AddCounter("depthbench_x_total", "Help.",
//                                        {"method", "code"}));
//   rpcs->WithLabelValues({"AcquireJob", "OK"}).Increment();
//   std::string text = registry.Render();
//
// Names (metric, label) are validated at registration and errors come back
// as absl::Status (InvalidArgument, AlreadyExists). Counter names must end in
// "_total" (the Prometheus convention that `promtool check metrics` lints).
// A family without labels has its single child created at registration, so
// it is exported (at 0) before its first update.
//
// Thread safety: everything here is safe to use from any thread.
//   - Counter, Gauge and Histogram updates are lock-free atomics.
//   - MetricFamily lookups take the family's mutex (one map lookup).
//   - Render() may run concurrently with updates and with other Render()
//     calls; it holds each family's mutex while copying that family's values.
//     Each value is read atomically; a histogram's buckets, _sum and _count
//     may be from slightly different instants under concurrent Observe()
//     calls, but _count always equals the +Inf bucket and buckets are
//     cumulative (monotonic) in every rendering.
//   - Collect callbacks run on the scraping thread with no registry lock
//     held; they must themselves be thread-safe, since two scrapes may run
//     them concurrently.
//
// Ownership: the registry owns every family and child. Family pointers stay
// valid for the registry's lifetime; a child reference stays valid until that
// child is removed (MetricFamily::Remove/Clear) or the registry is destroyed.
#ifndef DEPTHBENCH_COMMON_METRICS_H_
#define DEPTHBENCH_COMMON_METRICS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace depthbench {

enum class MetricType { kCounter, kGauge, kHistogram };

// "counter", "gauge" or "histogram", as written on a `# TYPE` line.
const char* MetricTypeName(MetricType type);

// A monotonically increasing value.
class Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds `delta`. A negative or NaN delta is ignored: a counter never goes
  // down (reset a counter only by restarting the process).
  void Increment(double delta = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that can go up and down.
class Gauge {
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Increment(double delta = 1.0);
  void Decrement(double delta = 1.0) { Increment(-delta); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A consistent-enough copy of a histogram child, see the header comment.
struct HistogramSnapshot {
  std::vector<double> upper_bounds;   // finite bounds, ascending
  std::vector<uint64_t> cumulative;   // upper_bounds.size() + 1 (+Inf last)
  double sum = 0;
  uint64_t count = 0;                 // == cumulative.back()
};

// Counts observations into fixed buckets (`le` upper bounds, inclusive) and
// keeps their sum.
class Histogram {
 public:
  // `upper_bounds` must be finite and strictly ascending (checked by
  // MetricsRegistry::AddHistogram); the +Inf bucket is implicit.
  explicit Histogram(std::vector<double> upper_bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // Records one observation. NaN lands in the +Inf bucket and makes the sum
  // NaN (the Go client's behaviour).
  void Observe(double value);
  HistogramSnapshot Snapshot() const;

 private:
  const std::vector<double> upper_bounds_;
  // One non-cumulative count per bucket, +Inf last.
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0.0};
};

// Bucket helpers (finite bounds only; +Inf is implicit).
// start, start*factor, ... (count bounds). Requires start > 0, factor > 1.
std::vector<double> ExponentialBuckets(double start, double factor, int count);
// start, start+width, ... (count bounds). Requires width > 0.
std::vector<double> LinearBuckets(double start, double width, int count);
// 0.5 ms .. ~16 s, factor 2: suits RPC and SQLite latencies in seconds.
std::vector<double> DefaultLatencyBuckets();

// Records the steady-clock time between construction and destruction (in
// seconds) into a histogram. Measures a duration for reporting only, never a
// timeout, so it reads std::chrono::steady_clock directly instead of the
// injected Clock (whose resolution is milliseconds).
class ScopedHistogramTimer {
 public:
  explicit ScopedHistogramTimer(Histogram* histogram)
      : histogram_(histogram), start_(std::chrono::steady_clock::now()) {}
  ~ScopedHistogramTimer();
  ScopedHistogramTimer(const ScopedHistogramTimer&) = delete;
  ScopedHistogramTimer& operator=(const ScopedHistogramTimer&) = delete;

 private:
  Histogram* histogram_;
  std::chrono::steady_clock::time_point start_;
};

// Type-erased family interface used by the registry to render.
class MetricFamilyBase {
 public:
  MetricFamilyBase(std::string name, std::string help, MetricType type,
                   std::vector<std::string> label_names)
      : name_(std::move(name)),
        help_(std::move(help)),
        type_(type),
        label_names_(std::move(label_names)) {}
  virtual ~MetricFamilyBase() = default;
  MetricFamilyBase(const MetricFamilyBase&) = delete;
  MetricFamilyBase& operator=(const MetricFamilyBase&) = delete;

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  MetricType type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }

  // Appends `# HELP`, `# TYPE` and every sample line of this family.
  // Returns an error (and appends nothing) only for collect-on-scrape
  // families whose callback failed.
  virtual absl::Status AppendTo(std::string* out) const = 0;

 protected:
  // Aborts with a message if `values.size()` differs from the label count:
  // a programming error in the daemon, never an input error.
  void CheckLabelCount(const std::vector<std::string>& values) const;
  void AppendHeader(std::string* out) const;

 private:
  const std::string name_;
  const std::string help_;
  const MetricType type_;
  const std::vector<std::string> label_names_;
};

// Appends one sample line: name{labels[,extra_label="extra_value"]} value.
// `extra_label` may be null. Used by the renderers; public for the benchmark.
void AppendSampleLine(const std::string& name,
                      const std::vector<std::string>& label_names,
                      const std::vector<std::string>& label_values,
                      const char* extra_label, const std::string& extra_value,
                      double value, std::string* out);

// Append the sample lines of one child (a histogram child gives
// _bucket/_sum/_count lines). Used by MetricFamily<T>::AppendTo.
void AppendChildSamples(const MetricFamilyBase& family,
                        const std::vector<std::string>& values,
                        const Counter& child, std::string* out);
void AppendChildSamples(const MetricFamilyBase& family,
                        const std::vector<std::string>& values,
                        const Gauge& child, std::string* out);
void AppendChildSamples(const MetricFamilyBase& family,
                        const std::vector<std::string>& values,
                        const Histogram& child, std::string* out);

// Children of one metric keyed by label values (in the order of
// label_names()). T is Counter, Gauge or Histogram.
template <typename T>
class MetricFamily final : public MetricFamilyBase {
 public:
  using Factory = std::function<std::unique_ptr<T>()>;

  MetricFamily(std::string name, std::string help, MetricType type,
               std::vector<std::string> label_names, Factory factory)
      : MetricFamilyBase(std::move(name), std::move(help), type,
                         std::move(label_names)),
        factory_(std::move(factory)) {
    if (this->label_names().empty()) WithLabelValues({});
  }

  // Returns the child for `values`, creating it (at zero) on first use.
  // `values` has one entry per label name, same order; any string is a
  // valid value (escaped on output). Aborts on a wrong count.
  T& WithLabelValues(const std::vector<std::string>& values) {
    CheckLabelCount(values);
    absl::MutexLock lock(&mu_);
    std::unique_ptr<T>& child = children_[values];
    if (child == nullptr) child = factory_();
    return *child;
  }

  // Removes the child for `values` (e.g. a finished job's series); returns
  // whether it existed. The caller guarantees no other thread still uses a
  // reference to that child.
  bool Remove(const std::vector<std::string>& values) {
    absl::MutexLock lock(&mu_);
    return children_.erase(values) > 0;
  }

  // Removes every child (same caveat as Remove).
  void Clear() {
    absl::MutexLock lock(&mu_);
    children_.clear();
  }

  size_t size() const {
    absl::MutexLock lock(&mu_);
    return children_.size();
  }

  absl::Status AppendTo(std::string* out) const override {
    AppendHeader(out);
    absl::MutexLock lock(&mu_);
    for (const auto& [values, child] : children_) {
      AppendChildSamples(*this, values, *child, out);
    }
    return absl::OkStatus();
  }

 private:
  const Factory factory_;
  mutable absl::Mutex mu_;
  // Sorted by label values, so output order is deterministic.
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_
      ABSL_GUARDED_BY(mu_);
};

using CounterFamily = MetricFamily<Counter>;
using GaugeFamily = MetricFamily<Gauge>;
using HistogramFamily = MetricFamily<Histogram>;

// One sample produced by a collect-on-scrape callback.
struct CollectedSample {
  std::vector<std::string> label_values;  // one per label name
  double value = 0;
};
using CollectCallback =
    std::function<absl::StatusOr<std::vector<CollectedSample>>()>;

// Owns every metric family of one process and renders them.
class MetricsRegistry {
 public:
  // The Content-Type of Render()'s output.
  static constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

  // Registers the self-metric depthbench_metrics_collect_errors_total.
  MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // `name` must end in "_total".
  absl::StatusOr<CounterFamily*> AddCounter(
      const std::string& name, const std::string& help,
      std::vector<std::string> label_names = {});
  absl::StatusOr<GaugeFamily*> AddGauge(
      const std::string& name, const std::string& help,
      std::vector<std::string> label_names = {});
  // `upper_bounds`: finite, strictly ascending, non-empty; "le" may not be a
  // label name.
  absl::StatusOr<HistogramFamily*> AddHistogram(
      const std::string& name, const std::string& help,
      std::vector<std::string> label_names, std::vector<double> upper_bounds);

  // A counter or gauge family whose samples `collect` returns at every
  // scrape (the callback's result replaces any earlier one, so series that
  // disappear from the source disappear from /metrics). If the callback
  // fails, or returns a sample with the wrong number of label values or a
  // duplicate label set, the family is left out of that scrape and
  // depthbench_metrics_collect_errors_total{family=NAME} is incremented
  // (that series is exported at 0 from registration on).
  absl::Status AddCollectedFamily(MetricType type, const std::string& name,
                                  const std::string& help,
                                  std::vector<std::string> label_names,
                                  CollectCallback collect);
  // Shorthand: an unlabelled gauge whose value `value_fn` computes per scrape.
  absl::Status AddCollectedGauge(const std::string& name,
                                 const std::string& help,
                                 std::function<double()> value_fn);

  // The text exposition (format 0.0.4) of every family, sorted by name,
  // except the registry's own collect-errors family, which comes last so it
  // counts errors of this very scrape.
  std::string Render() const;

  // Number of registered families (including the self-metric).
  size_t family_count() const;

 private:
  absl::Status CheckNewFamily(const std::string& name, MetricType type,
                              const std::vector<std::string>& label_names)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  template <typename F>
  F* Insert(std::unique_ptr<F> family) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  // Family name -> family; add-only, so pointers handed out stay valid.
  std::map<std::string, std::unique_ptr<MetricFamilyBase>> families_
      ABSL_GUARDED_BY(mu_);
  // Every sample name in use (a histogram claims _bucket, _sum, _count).
  std::map<std::string, std::string> sample_names_ ABSL_GUARDED_BY(mu_);
  CounterFamily* collect_errors_ = nullptr;  // set once in the constructor
  mutable std::atomic<size_t> last_render_bytes_{0};  // capacity hint
};

}  // namespace depthbench

#endif  // DEPTHBENCH_COMMON_METRICS_H_
