// What the project's layer over prometheus-cpp adds: misuse as a Status
// (never an exception), one label set per name, callback gauges, escaped
// help and a stable exposition order. The format itself is prometheus-cpp's;
// metrics_promtool_test.cc has Prometheus' own linter read it.
#include "common/metrics_registry.h"

#include <atomic>
#include <cmath>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(MetricsRegistry, RendersEachTypeSortedByNameAndLabels) {
  MetricsRegistry registry;
  // Registered out of order: the text is sorted regardless.
  (*registry.GetGauge("pt_b", "A gauge.", {{"k", "2"}}))->Set(-1.5);
  (*registry.GetGauge("pt_b", "A gauge.", {{"k", "1"}}))->Set(2);
  Histogram* h = *registry.GetHistogram("pt_c_seconds", "A histogram.",
                                        {0.5, 2.0}, {{"phase", "f"}});
  for (double v : {0.25, 0.5, 1.0, 7.0}) h->Observe(v);
  (*registry.GetCounter("pt_a_total", "A counter."))->Increment(3);
  EXPECT_EQ(registry.RenderText(),
            "# HELP pt_a_total A counter.\n"
            "# TYPE pt_a_total counter\n"
            "pt_a_total 3\n"
            "# HELP pt_b A gauge.\n"
            "# TYPE pt_b gauge\n"
            "pt_b{k=\"1\"} 2\n"
            "pt_b{k=\"2\"} -1.5\n"
            "# HELP pt_c_seconds A histogram.\n"
            "# TYPE pt_c_seconds histogram\n"
            "pt_c_seconds_count{phase=\"f\"} 4\n"
            "pt_c_seconds_sum{phase=\"f\"} 8.75\n"
            "pt_c_seconds_bucket{phase=\"f\",le=\"0.5\"} 2\n"
            "pt_c_seconds_bucket{phase=\"f\",le=\"2\"} 3\n"
            "pt_c_seconds_bucket{phase=\"f\",le=\"+Inf\"} 4\n");
}

TEST(MetricsRegistry, SameNameAndLabelsGiveTheSameMetric) {
  MetricsRegistry registry;
  const Labels ab = {{"a", "1"}, {"b", "2"}};
  const Labels ba = {{"b", "2"}, {"a", "1"}};
  Counter* first = *registry.GetCounter("pt_x_total", "X.", ab);
  Counter* again = *registry.GetCounter("pt_x_total", "ignored", ba);
  EXPECT_EQ(first, again);
  Counter* other =
      *registry.GetCounter("pt_x_total", "X.", {{"a", "1"}, {"b", "3"}});
  EXPECT_NE(first, other);
  first->Increment(2);
  EXPECT_THAT(registry.RenderText(), HasSubstr("# HELP pt_x_total X.\n"));
}

TEST(MetricsRegistry, MisuseIsAStatusNotAnException) {
  MetricsRegistry registry;
  // Each of these makes prometheus-cpp throw or render invalid text.
  EXPECT_EQ(registry.GetCounter("bad name", "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.GetCounter("0_total", "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      registry.GetGauge("pt_g", "x", {{"bad-label", "1"}}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      registry.GetGauge("pt_g", "x", {{"__reserved", "1"}}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      registry.GetGauge("pt_g", "x", {{"a", "1"}, {"a", "2"}}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.GetHistogram("pt_h", "x", {2.0, 1.0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.GetHistogram("pt_h", "x", {1.0, NAN}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      registry.GetHistogram("pt_h", "x", {1.0}, {{"le", "1"}}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddCallbackGauge("pt_cb", "x", {}, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  // Nothing half-registered: the text stays empty.
  EXPECT_EQ(registry.RenderText(), "");
}

TEST(MetricsRegistry, ANameKeepsItsTypeLabelsAndBuckets) {
  MetricsRegistry registry;
  ASSERT_TRUE(registry.GetCounter("pt_n_total", "N.", {{"a", "1"}}).ok());
  // Another type (prometheus-cpp throws here).
  EXPECT_EQ(registry.GetGauge("pt_n_total", "N.", {{"a", "1"}}).status().code(),
            absl::StatusCode::kAlreadyExists);
  // Other label names (prometheus-cpp would accept them).
  EXPECT_EQ(registry.GetCounter("pt_n_total", "N.").status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(
      registry.GetCounter("pt_n_total", "N.", {{"b", "1"}}).status().code(),
      absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(registry.GetHistogram("pt_h_seconds", "H.", {1, 2}).ok());
  EXPECT_EQ(registry.GetHistogram("pt_h_seconds", "H.", {1, 3}).status().code(),
            absl::StatusCode::kAlreadyExists);
  // A trailing +Inf is the implicit bucket: the same buckets.
  EXPECT_TRUE(
      registry.GetHistogram("pt_h_seconds", "H.", {1, 2, INFINITY}).ok());
  ASSERT_TRUE(registry
                  .AddCallbackGauge("pt_cb", "C.", {},
                                    [] {
                                      return std::vector<GaugeSample>{{{}, 1}};
                                    })
                  .ok());
  EXPECT_EQ(registry.GetGauge("pt_cb", "C.").status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry
                .AddCallbackGauge("pt_cb", "C.", {},
                                  [] { return std::vector<GaugeSample>{}; })
                .code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry
                .AddCallbackGauge("pt_n_total", "C.", {"a"},
                                  [] { return std::vector<GaugeSample>{}; })
                .code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(MetricsRegistry, EscapesHelpAndLabelValues) {
  MetricsRegistry registry;
  (*registry.GetCounter("pt_e_total", "Back\\slash and\nnewline.",
                        {{"path", "a\\b \"c\"\nd"}}))
      ->Increment();
  EXPECT_EQ(registry.RenderText(),
            "# HELP pt_e_total Back\\\\slash and\\nnewline.\n"
            "# TYPE pt_e_total counter\n"
            "pt_e_total{path=\"a\\\\b \\\"c\\\"\\nd\"} 1\n");
}

TEST(MetricsRegistry, LabelledFamilyWithoutChildrenIsOmitted) {
  MetricsRegistry registry;
  ASSERT_TRUE(registry
                  .AddCallbackGauge("pt_empty", "E.", {"job"},
                                    [] { return std::vector<GaugeSample>{}; })
                  .ok());
  EXPECT_EQ(registry.RenderText(), "");
}

TEST(MetricsRegistry, CallbackGaugeIsComputedAtScrapeTime) {
  MetricsRegistry registry;
  std::atomic<int> running{1};
  ASSERT_TRUE(registry
                  .AddCallbackGauge(
                      "pt_workers", "Workers by state.", {"state", "pool"},
                      [&running] {
                        return std::vector<GaugeSample>{
                            {{"running", "a"}, double(running.load())},
                            {{"idle", "a"}, 2},
                            {{"idle", "a"}, 99},  // repeated: dropped
                            {{"lost"}, 5},        // wrong arity: dropped
                        };
                      })
                  .ok());
  const std::string expected_head =
      "# HELP pt_workers Workers by state.\n"
      "# TYPE pt_workers gauge\n";
  EXPECT_EQ(registry.RenderText(),
            expected_head + "pt_workers{state=\"idle\",pool=\"a\"} 2\n" +
                "pt_workers{state=\"running\",pool=\"a\"} 1\n");
  running = 4;
  EXPECT_THAT(registry.RenderText(),
              HasSubstr("pt_workers{state=\"running\",pool=\"a\"} 4\n"));
  EXPECT_THAT(registry.RenderText(), Not(HasSubstr("99")));
}

// A callback may register and read metrics: it runs without the registry's
// lock held (a deadlock here hangs the test).
TEST(MetricsRegistry, CallbackMayUseTheRegistry) {
  MetricsRegistry registry;
  ASSERT_TRUE(
      registry
          .AddCallbackGauge("pt_scrapes", "Scrapes so far.", {},
                            [&registry] {
                              Counter* c = *registry.GetCounter(
                                  "pt_scrape_calls_total", "Calls.");
                              c->Increment();
                              return std::vector<GaugeSample>{{{}, c->Value()}};
                            })
          .ok());
  registry.RenderText();
  EXPECT_THAT(registry.RenderText(), HasSubstr("pt_scrapes 2\n"));
}

TEST(MetricsRegistry, ConcurrentLookupsAndUpdatesSumCorrectly) {
  MetricsRegistry registry;
  constexpr int kThreads = 4;
  constexpr int kPerThread = 1000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&registry, t] {
      for (int i = 0; i < kPerThread; ++i) {
        (*registry.GetCounter("pt_c_total", "C.",
                              {{"parity", std::to_string(t % 2)}}))
            ->Increment();
        registry.RenderText();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const std::string text = registry.RenderText();
  EXPECT_THAT(text, HasSubstr("pt_c_total{parity=\"0\"} 2000\n"));
  EXPECT_THAT(text, HasSubstr("pt_c_total{parity=\"1\"} 2000\n"));
}

TEST(MetricsRegistry, ExponentialBucketsMultiply) {
  EXPECT_EQ(ExponentialBuckets(0.25, 2, 4),
            (std::vector<double>{0.25, 0.5, 1, 2}));
  EXPECT_TRUE(ExponentialBuckets(0, 2, 4).empty());
  EXPECT_TRUE(ExponentialBuckets(1, 1, 4).empty());
  EXPECT_TRUE(ExponentialBuckets(1, 2, 0).empty());
}

}  // namespace
}  // namespace pipetrain
