#include "common/metrics.h"

#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/daemon_metrics.h"
#include "common/metric_names.h"
#include "common/prometheus_text.h"
#include "gtest/gtest.h"

namespace depthbench {
namespace {

// Render() without the registry's own collect-errors family, so expected
// strings only show what the test registered.
std::string RenderWithoutSelf(const MetricsRegistry& registry) {
  std::string out;
  for (absl::string_view line : absl::StrSplit(registry.Render(), '\n')) {
    if (line.empty()) continue;
    if (line.find(kMetricsCollectErrors) != absl::string_view::npos) continue;
    out.append(line.data(), line.size());
    out.push_back('\n');
  }
  return out;
}

TEST(PrometheusTextTest, MetricNames) {
  EXPECT_TRUE(IsValidMetricName("depthbench_x_total"));
  EXPECT_TRUE(IsValidMetricName("a:b_c9"));
  EXPECT_TRUE(IsValidMetricName("_x"));
  EXPECT_FALSE(IsValidMetricName(""));
  EXPECT_FALSE(IsValidMetricName("9x"));
  EXPECT_FALSE(IsValidMetricName("a-b"));
  EXPECT_FALSE(IsValidMetricName("a b"));
  EXPECT_FALSE(IsValidMetricName("é"));
}

TEST(PrometheusTextTest, LabelNames) {
  EXPECT_TRUE(IsValidLabelName("job_id"));
  EXPECT_TRUE(IsValidLabelName("_a1"));
  EXPECT_FALSE(IsValidLabelName(""));
  EXPECT_FALSE(IsValidLabelName("__name__"));
  EXPECT_FALSE(IsValidLabelName("a:b"));
  EXPECT_FALSE(IsValidLabelName("1a"));
}

TEST(PrometheusTextTest, EscapesLabelValues) {
  std::string out;
  AppendEscapedLabelValue("a\\b\"c\nd'e", &out);
  EXPECT_EQ(out, "a\\\\b\\\"c\\nd'e");
}

TEST(PrometheusTextTest, EscapesHelpButKeepsQuotes) {
  std::string out;
  AppendEscapedHelp("say \"hi\"\\\nnext", &out);
  EXPECT_EQ(out, "say \"hi\"\\\\\\nnext");
}

TEST(PrometheusTextTest, FormatsValues) {
  EXPECT_EQ(FormatSampleValue(0), "0");
  EXPECT_EQ(FormatSampleValue(3), "3");
  EXPECT_EQ(FormatSampleValue(-2.5), "-2.5");
  EXPECT_EQ(FormatSampleValue(0.1), "0.1");
  EXPECT_EQ(FormatSampleValue(1e21), "1e+21");
  EXPECT_EQ(FormatSampleValue(std::numeric_limits<double>::infinity()),
            "+Inf");
  EXPECT_EQ(FormatSampleValue(-std::numeric_limits<double>::infinity()),
            "-Inf");
  EXPECT_EQ(FormatSampleValue(std::nan("")), "NaN");
  const double third = 1.0 / 3.0;
  EXPECT_EQ(std::stod(FormatSampleValue(third)), third);  // round-trips
}

TEST(MetricsRegistryTest, RendersCounterWithHelpTypeAndLabels) {
  MetricsRegistry registry;
  absl::StatusOr<CounterFamily*> rpcs = registry.AddCounter(
      "test_rpcs_total", "RPCs \"handled\".\nSecond line \\ end.",
      {"method", "code"});
  ASSERT_TRUE(rpcs.ok()) << rpcs.status();
  (*rpcs)->WithLabelValues({"Get", "OK"}).Increment();
  (*rpcs)->WithLabelValues({"Get", "OK"}).Increment(2.5);
  (*rpcs)->WithLabelValues({"A\"b\\c\nd", "NOT_FOUND"}).Increment();
  EXPECT_EQ(RenderWithoutSelf(registry),
            "# HELP test_rpcs_total RPCs \"handled\".\\nSecond line \\\\ "
            "end.\n"
            "# TYPE test_rpcs_total counter\n"
            "test_rpcs_total{method=\"A\\\"b\\\\c\\nd\",code=\"NOT_FOUND\"} 1\n"
            "test_rpcs_total{method=\"Get\",code=\"OK\"} 3.5\n");
}

TEST(MetricsRegistryTest, UnlabelledFamiliesExportZeroBeforeFirstUpdate) {
  MetricsRegistry registry;
  ASSERT_TRUE(registry.AddCounter("b_total", "B.").ok());
  ASSERT_TRUE(registry.AddGauge("a", "A.").ok());
  EXPECT_EQ(RenderWithoutSelf(registry),
            "# HELP a A.\n# TYPE a gauge\na 0\n"
            "# HELP b_total B.\n# TYPE b_total counter\nb_total 0\n");
}

TEST(MetricsRegistryTest, CounterIgnoresNegativeAndNaN) {
  Counter c;
  c.Increment(2);
  c.Increment(-1);
  c.Increment(std::nan(""));
  EXPECT_EQ(c.Value(), 2);
}

TEST(MetricsRegistryTest, GaugeGoesBothWays) {
  MetricsRegistry registry;
  GaugeFamily* g = *registry.AddGauge("g", "G.", {"k"});
  Gauge& child = g->WithLabelValues({"v"});
  child.Set(5);
  child.Increment(2);
  child.Decrement(10);
  EXPECT_EQ(child.Value(), -3);
  EXPECT_EQ(&child, &g->WithLabelValues({"v"}));  // same child
  EXPECT_EQ(g->size(), 1u);
  EXPECT_TRUE(g->Remove({"v"}));
  EXPECT_FALSE(g->Remove({"v"}));
  EXPECT_EQ(RenderWithoutSelf(registry), "# HELP g G.\n# TYPE g gauge\n");
}

TEST(MetricsRegistryTest, HistogramBucketsAreCumulativeWithInf) {
  MetricsRegistry registry;
  HistogramFamily* h =
      *registry.AddHistogram("lat_seconds", "Latency.", {"m"}, {0.1, 1, 10});
  Histogram& child = h->WithLabelValues({"x"});
  for (double v : {0.05, 0.1, 0.5, 1.0, 3.0, 100.0}) child.Observe(v);
  EXPECT_EQ(RenderWithoutSelf(registry),
            "# HELP lat_seconds Latency.\n"
            "# TYPE lat_seconds histogram\n"
            "lat_seconds_bucket{m=\"x\",le=\"0.1\"} 2\n"
            "lat_seconds_bucket{m=\"x\",le=\"1\"} 4\n"
            "lat_seconds_bucket{m=\"x\",le=\"10\"} 5\n"
            "lat_seconds_bucket{m=\"x\",le=\"+Inf\"} 6\n"
            "lat_seconds_sum{m=\"x\"} 104.65\n"
            "lat_seconds_count{m=\"x\"} 6\n");
}

TEST(MetricsRegistryTest, HistogramNaNGoesToInfBucket) {
  Histogram h({1.0});
  h.Observe(std::nan(""));
  h.Observe(0.5);
  HistogramSnapshot s = h.Snapshot();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(s.count, 2u);
  EXPECT_TRUE(std::isnan(s.sum));
}

TEST(MetricsRegistryTest, UnlabelledHistogram) {
  MetricsRegistry registry;
  HistogramFamily* h = *registry.AddHistogram("d_seconds", "D.", {}, {1});
  h->WithLabelValues({}).Observe(2);
  EXPECT_EQ(RenderWithoutSelf(registry),
            "# HELP d_seconds D.\n# TYPE d_seconds histogram\n"
            "d_seconds_bucket{le=\"1\"} 0\n"
            "d_seconds_bucket{le=\"+Inf\"} 1\n"
            "d_seconds_sum 2\nd_seconds_count 1\n");
}

TEST(MetricsRegistryTest, RejectsBadRegistrations) {
  MetricsRegistry registry;
  EXPECT_EQ(registry.AddCounter("bad-name_total", "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddCounter("no_suffix", "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddGauge("g_total", "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddGauge("g", "x", {"__reserved"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddGauge("g", "x", {"a", "a"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddHistogram("h", "x", {"le"}, {1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddHistogram("h", "x", {}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddHistogram("h", "x", {}, {2, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry
                .AddHistogram("h", "x", {},
                              {1, std::numeric_limits<double>::infinity()})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(registry.AddGauge("g", "x").ok());
  EXPECT_EQ(registry.AddGauge("g", "x").status().code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(registry.AddHistogram("h", "x", {}, {1}).ok());
  // A histogram claims its derived series names.
  EXPECT_EQ(registry.AddGauge("h_count", "x").status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.AddGauge("h_bucket", "x").status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(MetricsRegistryDeathTest, WrongLabelCountAborts) {
  MetricsRegistry registry;
  GaugeFamily* g = *registry.AddGauge("g", "G.", {"a", "b"});
  EXPECT_DEATH(g->WithLabelValues({"only_one"}), "takes 2 label values");
}

TEST(MetricsRegistryTest, CollectedFamilyIsComputedPerScrape) {
  MetricsRegistry registry;
  int scrapes = 0;
  ASSERT_TRUE(registry
                  .AddCollectedFamily(
                      MetricType::kGauge, "jobs", "Jobs.", {"state"},
                      [&scrapes]()
                          -> absl::StatusOr<std::vector<CollectedSample>> {
                        ++scrapes;
                        if (scrapes == 1) {
                          return std::vector<CollectedSample>{
                              {{"running"}, 2}, {{"pending"}, 5}};
                        }
                        return std::vector<CollectedSample>{{{"running"}, 1}};
                      })
                  .ok());
  EXPECT_EQ(RenderWithoutSelf(registry),
            "# HELP jobs Jobs.\n# TYPE jobs gauge\n"
            "jobs{state=\"pending\"} 5\njobs{state=\"running\"} 2\n");
  // The second scrape replaces the first: "pending" disappears.
  EXPECT_EQ(RenderWithoutSelf(registry),
            "# HELP jobs Jobs.\n# TYPE jobs gauge\njobs{state=\"running\"} 1\n");
}

TEST(MetricsRegistryTest, FailingCollectorIsLeftOutAndCounted) {
  MetricsRegistry registry;
  ASSERT_TRUE(
      registry
          .AddCollectedFamily(
              MetricType::kGauge, "broken", "B.", {"a"},
              []() -> absl::StatusOr<std::vector<CollectedSample>> {
                return absl::UnavailableError("database locked");
              })
          .ok());
  ASSERT_TRUE(
      registry
          .AddCollectedFamily(
              MetricType::kGauge, "wrong_arity", "W.", {"a"},
              []() -> absl::StatusOr<std::vector<CollectedSample>> {
                return std::vector<CollectedSample>{{{"x", "y"}, 1}};
              })
          .ok());
  ASSERT_TRUE(
      registry
          .AddCollectedFamily(
              MetricType::kCounter, "dup_total", "D.", {"a"},
              []() -> absl::StatusOr<std::vector<CollectedSample>> {
                return std::vector<CollectedSample>{{{"x"}, 1}, {{"x"}, 2}};
              })
          .ok());
  ASSERT_TRUE(registry.AddCollectedGauge("fine", "F.", [] { return 7.0; }).ok());
  registry.Render();
  const std::string text = registry.Render();
  EXPECT_EQ(text.find("# TYPE broken "), std::string::npos);
  EXPECT_EQ(text.find("\nbroken"), std::string::npos);
  EXPECT_EQ(text.find("# TYPE wrong_arity "), std::string::npos);
  EXPECT_EQ(text.find("\nwrong_arity"), std::string::npos);
  EXPECT_EQ(text.find("# TYPE dup_total "), std::string::npos);
  EXPECT_EQ(text.find("\ndup_total"), std::string::npos);
  EXPECT_NE(text.find("\nfine 7\n"), std::string::npos);
  EXPECT_NE(text.find("depthbench_metrics_collect_errors_total{family=\"broken\"} 2\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("depthbench_metrics_collect_errors_total{family=\"wrong_arity\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("depthbench_metrics_collect_errors_total{family=\"dup_total\"} 2\n"),
            std::string::npos);
  EXPECT_EQ(registry
                .AddCollectedFamily(MetricType::kHistogram, "h", "H.", {},
                                    [] {
                                      return absl::StatusOr<
                                          std::vector<CollectedSample>>();
                                    })
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MetricsRegistryTest, ConcurrentUpdatesAndScrapesAreConsistent) {
  MetricsRegistry registry;
  CounterFamily* c = *registry.AddCounter("c_total", "C.", {"t"});
  HistogramFamily* h = *registry.AddHistogram("h_seconds", "H.", {}, {0.5});
  constexpr int kThreads = 4;
  constexpr int kIncrements = 20000;
  std::atomic<bool> done{false};
  std::thread scraper([&] {
    while (!done.load()) {
      const std::string text = registry.Render();
      // +Inf bucket always equals _count, and buckets never decrease.
      const size_t le05 = text.find("h_seconds_bucket{le=\"0.5\"} ");
      const size_t inf = text.find("h_seconds_bucket{le=\"+Inf\"} ");
      const size_t count = text.find("h_seconds_count ");
      ASSERT_NE(le05, std::string::npos);
      const double v05 = std::stod(text.substr(le05 + 26));
      const double vinf = std::stod(text.substr(inf + 28));
      const double vcount = std::stod(text.substr(count + 16));
      ASSERT_LE(v05, vinf);
      ASSERT_EQ(vinf, vcount);
    }
  });
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&, t] {
      for (int i = 0; i < kIncrements; ++i) {
        c->WithLabelValues({"shared"}).Increment();
        c->WithLabelValues({std::to_string(t)}).Increment();
        h->WithLabelValues({}).Observe(i % 2 == 0 ? 0.25 : 1.0);
      }
    });
  }
  for (std::thread& w : writers) w.join();
  done.store(true);
  scraper.join();
  EXPECT_EQ(c->WithLabelValues({"shared"}).Value(), kThreads * kIncrements);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(c->WithLabelValues({std::to_string(t)}).Value(), kIncrements);
  }
  const HistogramSnapshot s = h->WithLabelValues({}).Snapshot();
  EXPECT_EQ(s.count, static_cast<uint64_t>(kThreads * kIncrements));
  EXPECT_EQ(s.cumulative[0], static_cast<uint64_t>(kThreads * kIncrements / 2));
  EXPECT_DOUBLE_EQ(s.sum, kThreads * kIncrements / 2 * 1.25);
}

TEST(MetricsRegistryTest, BucketHelpers) {
  EXPECT_EQ(ExponentialBuckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
  EXPECT_EQ(LinearBuckets(0, 5, 3), (std::vector<double>{0, 5, 10}));
  const std::vector<double> latency = DefaultLatencyBuckets();
  ASSERT_EQ(latency.size(), 16u);
  EXPECT_DOUBLE_EQ(latency.front(), 0.0005);
  EXPECT_GT(latency.back(), 10);
}

TEST(MetricsRegistryTest, ScopedTimerObservesOnce) {
  Histogram h({1000});
  { ScopedHistogramTimer timer(&h); }
  const HistogramSnapshot s = h.Snapshot();
  EXPECT_EQ(s.count, 1u);
  EXPECT_GE(s.sum, 0);
  EXPECT_LT(s.sum, 1000);
}

TEST(DaemonMetricsTest, SchedulerMetricsUseTheNameTable) {
  MetricsRegistry registry;
  absl::StatusOr<SchedulerMetrics> m = RegisterSchedulerMetrics(
      &registry, "0.1.0",
      []() -> absl::StatusOr<std::vector<CollectedSample>> {
        return std::vector<CollectedSample>{{{"s1", "running"}, 3}};
      });
  ASSERT_TRUE(m.ok()) << m.status();
  m->RecordRpc("AcquireJob", "OK", 0.002);
  m->leases_granted->Increment();
  const std::string text = registry.Render();
  EXPECT_NE(text.find("depthbench_build_info{component=\"scheduler\",version=\"0.1.0\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("depthbench_scheduler_jobs{sweep=\"s1\",state=\"running\"} 3\n"),
            std::string::npos);
  EXPECT_NE(text.find("depthbench_scheduler_rpcs_total{method=\"AcquireJob\",code=\"OK\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("depthbench_scheduler_rpc_duration_seconds_count{method=\"AcquireJob\",code=\"OK\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("depthbench_scheduler_leases_granted_total 1\n"),
            std::string::npos);
  // Every scheduler metric in the table is registered with its help text.
  for (const MetricSpec& spec : kMetricSpecs) {
    const std::string name = spec.name;
    if (name.rfind("depthbench_worker_", 0) == 0) continue;
    EXPECT_NE(text.find("# HELP " + name + " " + spec.help + "\n# TYPE " +
                        name + " " + spec.type + "\n"),
              std::string::npos)
        << name;
  }
  // Registering twice fails instead of silently sharing.
  EXPECT_FALSE(RegisterSchedulerMetrics(&registry, "0.1.0", [] {
                 return absl::StatusOr<std::vector<CollectedSample>>();
               }).ok());
}

TEST(DaemonMetricsTest, WorkerMetricsAddAndRemoveJobSeries) {
  MetricsRegistry registry;
  double age = 4.5;
  absl::StatusOr<WorkerMetrics> m =
      RegisterWorkerMetrics(&registry, "0.1.0", [&age] { return age; });
  ASSERT_TRUE(m.ok()) << m.status();
  const JobLabels job{"j-17", "depth", "pre_ln"};
  m->SetSlots(1, 3);
  m->RecordStep(job, 120, 3.25, 15000);
  m->RecordEval(job, 3.5);
  std::string text = registry.Render();
  EXPECT_NE(text.find("depthbench_worker_slots{state=\"busy\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("depthbench_worker_slots{state=\"free\"} 3\n"),
            std::string::npos);
  EXPECT_NE(text.find("depthbench_worker_job_step{job_id=\"j-17\",sweep=\"depth\",arch=\"pre_ln\"} 120\n"),
            std::string::npos);
  EXPECT_NE(text.find("depthbench_worker_job_training_loss{job_id=\"j-17\",sweep=\"depth\",arch=\"pre_ln\"} 3.25\n"),
            std::string::npos);
  EXPECT_NE(text.find("depthbench_worker_job_validation_loss{job_id=\"j-17\",sweep=\"depth\",arch=\"pre_ln\"} 3.5\n"),
            std::string::npos);
  EXPECT_NE(text.find("depthbench_worker_last_heartbeat_age_seconds 4.5\n"),
            std::string::npos);
  age = 6;
  m->RemoveJob(job);
  text = registry.Render();
  EXPECT_EQ(text.find("j-17"), std::string::npos);
  EXPECT_NE(text.find("depthbench_worker_last_heartbeat_age_seconds 6\n"),
            std::string::npos);
}

TEST(DaemonMetricsTest, NameTableIsWellFormed) {
  std::set<std::string> names;
  for (const MetricSpec& spec : kMetricSpecs) {
    const std::string name = spec.name;
    EXPECT_EQ(name.rfind("depthbench_", 0), 0u) << name;
    EXPECT_TRUE(IsValidMetricName(name)) << name;
    EXPECT_TRUE(names.insert(name).second) << "duplicate " << name;
    const std::string type = spec.type;
    EXPECT_TRUE(type == "counter" || type == "gauge" || type == "histogram");
    EXPECT_EQ(type == "counter",
              name.size() > 6 && name.substr(name.size() - 6) == "_total")
        << name;
    EXPECT_NE(std::string(spec.help), "");
    EXPECT_EQ(FindMetricSpec(name), &spec);
  }
  EXPECT_EQ(FindMetricSpec("nope"), nullptr);
  const std::vector<std::string> series = AllExportedSeriesNames();
  EXPECT_NE(std::find(series.begin(), series.end(),
                      std::string(kSchedulerRpcDuration) + "_bucket"),
            series.end());
}

}  // namespace
}  // namespace depthbench
