#include "common/metrics.h"

#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

TEST(MetricsRegistry, RendersEachTypeExactly) {
  MetricsRegistry registry;
  CounterFamily* requests = *registry.AddCounterFamily(
      "pt_requests_total", "Requests served.", {"method", "code"});
  (*requests->WithLabelValues({"POST", "500"}))->Increment(1.5);
  (*requests->WithLabelValues({"GET", "200"}))->Increment(3);
  Gauge* in_flight = *registry.GetGauge("pt_in_flight", "Requests in flight.");
  in_flight->Set(2);
  Histogram* latency = *registry.GetHistogram(
      "pt_latency_seconds", "Request latency.", {0.25, 0.5, 1});
  for (double v : {0.125, 0.25, 0.75, 4.0}) latency->Observe(v);

  EXPECT_EQ(registry.RenderText(),
            "# HELP pt_in_flight Requests in flight.\n"
            "# TYPE pt_in_flight gauge\n"
            "pt_in_flight 2\n"
            "# HELP pt_latency_seconds Request latency.\n"
            "# TYPE pt_latency_seconds histogram\n"
            "pt_latency_seconds_bucket{le=\"0.25\"} 2\n"
            "pt_latency_seconds_bucket{le=\"0.5\"} 2\n"
            "pt_latency_seconds_bucket{le=\"1\"} 3\n"
            "pt_latency_seconds_bucket{le=\"+Inf\"} 4\n"
            "pt_latency_seconds_sum 5.125\n"
            "pt_latency_seconds_count 4\n"
            "# HELP pt_requests_total Requests served.\n"
            "# TYPE pt_requests_total counter\n"
            "pt_requests_total{method=\"GET\",code=\"200\"} 3\n"
            "pt_requests_total{method=\"POST\",code=\"500\"} 1.5\n");
}

TEST(MetricsRegistry, LabelledHistogramPutsLeLast) {
  MetricsRegistry registry;
  Histogram* h = *registry.GetHistogram("pt_step_seconds", "Step time.", {1},
                                        {{"phase", "forward"}});
  h->Observe(0.5);
  EXPECT_EQ(registry.RenderText(),
            "# HELP pt_step_seconds Step time.\n"
            "# TYPE pt_step_seconds histogram\n"
            "pt_step_seconds_bucket{phase=\"forward\",le=\"1\"} 1\n"
            "pt_step_seconds_bucket{phase=\"forward\",le=\"+Inf\"} 1\n"
            "pt_step_seconds_sum{phase=\"forward\"} 0.5\n"
            "pt_step_seconds_count{phase=\"forward\"} 1\n");
}

TEST(MetricsRegistry, EscapesLabelValuesAndHelp) {
  MetricsRegistry registry;
  Counter* c = *registry.GetCounter("pt_escapes_total",
                                    "Help with \\ and\nnewline and \"quotes\".",
                                    {{"path", "C:\\dir \"x\"\nend"}});
  c->Increment();
  EXPECT_EQ(registry.RenderText(),
            "# HELP pt_escapes_total Help with \\\\ and\\nnewline and "
            "\"quotes\".\n"
            "# TYPE pt_escapes_total counter\n"
            "pt_escapes_total{path=\"C:\\\\dir \\\"x\\\"\\nend\"} 1\n");
}

TEST(MetricsRegistry, ConcurrentUpdatesSumCorrectly) {
  MetricsRegistry registry;
  Counter* counter = *registry.GetCounter("pt_events_total", "Events.");
  Gauge* gauge = *registry.GetGauge("pt_level", "Level.");
  Histogram* hist =
      *registry.GetHistogram("pt_size_bytes", "Sizes.", {10, 100});
  constexpr int kThreads = 8;
  constexpr int kIterations = 50000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIterations; ++i) {
        counter->Increment(0.5);
        gauge->Increment(2);
        gauge->Decrement(1);
        hist->Observe(t % 2 == 0 ? 5 : 50);
      }
      // Concurrent lookups return the same children.
      EXPECT_EQ(*registry.GetCounter("pt_events_total", "Events."), counter);
    });
  }
  // Scraping while writers run must be safe.
  for (int i = 0; i < 20; ++i) (void)registry.RenderText();
  for (std::thread& thread : threads) thread.join();

  EXPECT_EQ(counter->Value(), 0.5 * kThreads * kIterations);
  EXPECT_EQ(gauge->Value(), 1.0 * kThreads * kIterations);
  EXPECT_EQ(hist->Count(), uint64_t{kThreads} * kIterations);
  EXPECT_EQ(hist->Sum(), (5.0 + 50.0) * (kThreads / 2) * kIterations);
  const std::string text = registry.RenderText();
  EXPECT_THAT(text, HasSubstr("pt_size_bytes_bucket{le=\"10\"} 200000\n"));
  EXPECT_THAT(text, HasSubstr("pt_size_bytes_bucket{le=\"100\"} 400000\n"));
  EXPECT_THAT(text, HasSubstr("pt_size_bytes_bucket{le=\"+Inf\"} 400000\n"));
}

TEST(Histogram, BucketsAreCumulativeAndUpperBoundInclusive) {
  MetricsRegistry registry;
  HistogramFamily* family =
      *registry.AddHistogramFamily("pt_h_seconds", "h", {}, {1, 2, 4});
  Histogram* h = *family->WithLabelValues({});
  for (double v : {-3.0, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, double{NAN}})
    h->Observe(v);
  EXPECT_EQ(h->Count(), 7u);  // NaN ignored
  const std::string text = registry.RenderText();
  EXPECT_THAT(text, HasSubstr("pt_h_seconds_bucket{le=\"1\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("pt_h_seconds_bucket{le=\"2\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("pt_h_seconds_bucket{le=\"4\"} 6\n"));
  EXPECT_THAT(text, HasSubstr("pt_h_seconds_bucket{le=\"+Inf\"} 7\n"));
  EXPECT_THAT(text, HasSubstr("pt_h_seconds_count 7\n"));
  EXPECT_THAT(text, HasSubstr("pt_h_seconds_sum 13.5\n"));
}

TEST(Histogram, TrailingInfBoundIsImplicit) {
  MetricsRegistry registry;
  HistogramFamily* a =
      *registry.AddHistogramFamily("pt_a_seconds", "a", {}, {1, INFINITY});
  EXPECT_EQ(a->bucket_bounds(), std::vector<double>({1}));
  const std::string text = registry.RenderText();
  ASSERT_NE(text.find("le=\"+Inf\""), std::string::npos);
  EXPECT_EQ(text.find("le=\"+Inf\""), text.rfind("le=\"+Inf\""));
}

TEST(MetricsRegistry, RejectsInvalidNames) {
  MetricsRegistry registry;
  for (const std::string bad : {"", "1abc", "a-b", "a b", "é", "a.b"}) {
    EXPECT_EQ(registry.AddCounterFamily(bad, "h", {}).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
  EXPECT_TRUE(registry.AddGaugeFamily("ok:name_1", "h", {}).ok());
  for (const std::string bad : {"", "1a", "a:b", "__reserved", "a-b"}) {
    EXPECT_EQ(registry.AddGaugeFamily("pt_g", "h", {bad}).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
  EXPECT_EQ(registry.AddGaugeFamily("pt_g", "h", {"a", "a"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      registry.AddHistogramFamily("pt_h", "h", {"le"}, {1}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      registry.AddHistogramFamily("pt_h", "h", {}, {2, 1}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      registry.AddHistogramFamily("pt_h", "h", {}, {1, NAN}).status().code(),
      absl::StatusCode::kInvalidArgument);
  // Nothing invalid was registered.
  EXPECT_EQ(registry.RenderText(),
            "# HELP ok:name_1 h\n# TYPE ok:name_1 gauge\nok:name_1 0\n");
}

TEST(MetricsRegistry, ReRegistrationReturnsSameFamilyOrFails) {
  MetricsRegistry registry;
  CounterFamily* first =
      *registry.AddCounterFamily("pt_x_total", "first help", {"a", "b"});
  absl::StatusOr<CounterFamily*> again =
      registry.AddCounterFamily("pt_x_total", "other help", {"a", "b"});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, first);
  EXPECT_EQ(
      registry.AddGaugeFamily("pt_x_total", "h", {"a", "b"}).status().code(),
      absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.AddCounterFamily("pt_x_total", "h", {"a"}).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(
      registry.AddCounterFamily("pt_x_total", "h", {"b", "a"}).status().code(),
      absl::StatusCode::kAlreadyExists);
  // The one-step lookup accepts the labels in any order.
  Counter* by_name =
      *registry.GetCounter("pt_x_total", "h", {{"b", "2"}, {"a", "1"}});
  EXPECT_EQ(*first->WithLabelValues({"1", "2"}), by_name);

  ASSERT_TRUE(registry.AddHistogramFamily("pt_y_seconds", "h", {}, {1}).ok());
  EXPECT_EQ(
      registry.AddHistogramFamily("pt_y_seconds", "h", {}, {2}).status().code(),
      absl::StatusCode::kAlreadyExists);
}

TEST(MetricFamily, ChildLookupChecksLabels) {
  MetricsRegistry registry;
  GaugeFamily* family =
      *registry.AddGaugeFamily("pt_state", "h", {"stage", "kind"});
  EXPECT_EQ(family->WithLabelValues({"0"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(family->WithLabels({{"stage", "0"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      family->WithLabels({{"stage", "0"}, {"other", "x"}}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      family->WithLabels({{"stage", "0"}, {"stage", "1"}}).status().code(),
      absl::StatusCode::kInvalidArgument);
  Gauge* a = *family->WithLabelValues({"0", "x"});
  EXPECT_EQ(*family->WithLabels({{"kind", "x"}, {"stage", "0"}}), a);
  EXPECT_NE(*family->WithLabelValues({"1", "x"}), a);
}

TEST(MetricsRegistry, LabelledFamilyWithoutChildrenIsOmitted) {
  MetricsRegistry registry;
  ASSERT_TRUE(registry.AddCounterFamily("pt_none_total", "h", {"a"}).ok());
  EXPECT_EQ(registry.RenderText(), "");
  ASSERT_TRUE(registry.AddCounterFamily("pt_zero_total", "h", {}).ok());
  EXPECT_EQ(registry.RenderText(),
            "# HELP pt_zero_total h\n# TYPE pt_zero_total counter\n"
            "pt_zero_total 0\n");
}

TEST(Counter, NeverDecreases) {
  Counter counter;
  counter.Increment(2);
  counter.Increment(-1);
  counter.Increment(NAN);
  EXPECT_EQ(counter.Value(), 2);
}

TEST(MetricsRegistry, CallbackGaugeIsComputedAtScrapeTime) {
  MetricsRegistry registry;
  int idle = 1;
  ASSERT_TRUE(registry
                  .AddCallbackGauge("pt_workers", "Workers by state.",
                                    {"state"},
                                    [&idle] {
                                      return std::vector<GaugeSample>{
                                          {{"running"}, 3},
                                          {{"idle"}, double(idle)},
                                          {{"bad", "count"}, 9},
                                          {{"idle"}, 100},
                                      };
                                    })
                  .ok());
  idle = 2;
  EXPECT_EQ(registry.RenderText(),
            "# HELP pt_workers Workers by state.\n"
            "# TYPE pt_workers gauge\n"
            "pt_workers{state=\"idle\"} 2\n"
            "pt_workers{state=\"running\"} 3\n");
  EXPECT_EQ(registry
                .AddCallbackGauge("pt_workers", "h", {"state"},
                                  [] { return std::vector<GaugeSample>{}; })
                .code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(
      registry.AddGaugeFamily("pt_workers", "h", {"state"}).status().code(),
      absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.AddCallbackGauge("pt_other", "h", {}, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MetricsRegistry, CallbackMayUseTheRegistry) {
  MetricsRegistry registry;
  ASSERT_TRUE(registry
                  .AddCallbackGauge("pt_reentrant", "h", {},
                                    [&registry] {
                                      // Would deadlock if rendering held the
                                      // registry lock.
                                      (void)registry.GetCounter("pt_side_total",
                                                                "h");
                                      return std::vector<GaugeSample>{{{}, 1}};
                                    })
                  .ok());
  EXPECT_THAT(registry.RenderText(), HasSubstr("pt_reentrant 1\n"));
}

TEST(FormatMetricValue, UsesShortestRoundTripAndSpecialNames) {
  EXPECT_EQ(FormatMetricValue(0), "0");
  EXPECT_EQ(FormatMetricValue(42), "42");
  EXPECT_EQ(FormatMetricValue(200000), "200000");
  EXPECT_EQ(FormatMetricValue(-3), "-3");
  EXPECT_EQ(FormatMetricValue(0.1), "0.1");
  EXPECT_EQ(FormatMetricValue(-2.5), "-2.5");
  EXPECT_EQ(FormatMetricValue(1e300), "1e+300");
  EXPECT_EQ(FormatMetricValue(INFINITY), "+Inf");
  EXPECT_EQ(FormatMetricValue(-INFINITY), "-Inf");
  EXPECT_EQ(FormatMetricValue(NAN), "NaN");
  EXPECT_EQ(std::stod(FormatMetricValue(1.0 / 3)), 1.0 / 3);
}

TEST(Buckets, Helpers) {
  EXPECT_EQ(ExponentialBuckets(1, 2, 4), std::vector<double>({1, 2, 4, 8}));
  EXPECT_EQ(LinearBuckets(0, 5, 3), std::vector<double>({0, 5, 10}));
  EXPECT_TRUE(ExponentialBuckets(0, 2, 4).empty());
  EXPECT_TRUE(LinearBuckets(0, -1, 4).empty());
}

}  // namespace
}  // namespace pipetrain
