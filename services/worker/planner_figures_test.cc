#include "services/worker/planner_figures.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

v1::WorkerInfo Measured() {
  v1::WorkerInfo info;
  info.set_message_overhead_seconds(0.000125);
  info.set_message_cpu_seconds(0.0000875);
  info.set_stream_hop_seconds(0.00031);
  info.set_message_cpu_seconds_per_byte(1.25e-9);
  info.set_host_cpus(2);
  return info;
}

TEST(PlannerFigures, ServedAsGaugesInTheTextFormat) {
  MetricsRegistry registry;
  ASSERT_TRUE(ExportPlannerFigures(Measured(), &registry).ok());
  const std::string text = registry.RenderText();
  EXPECT_THAT(text, HasSubstr("# TYPE pipetrain_worker_message_overhead_seconds"
                              " gauge\npipetrain_worker_message_overhead_"
                              "seconds 0.000125\n"));
  EXPECT_THAT(text, HasSubstr("\npipetrain_worker_message_cpu_seconds "
                              "8.75e-05\n"));
  EXPECT_THAT(text,
              HasSubstr("\npipetrain_worker_stream_hop_seconds 0.00031\n"));
  EXPECT_THAT(text, HasSubstr("\npipetrain_worker_message_cpu_seconds_per_"
                              "byte 1.25e-09\n"));
  EXPECT_THAT(text, HasSubstr("\npipetrain_worker_host_cpus 2\n"));
}

TEST(PlannerFigures, ReadBackFromMetricsGiveWhatTheWorkerRegistered) {
  MetricsRegistry registry;
  ASSERT_TRUE(ExportPlannerFigures(Measured(), &registry).ok());
  v1::WorkerInfo read;
  read.set_id("w0");
  ASSERT_TRUE(ReadPlannerFigures(registry.RenderText(), &read).ok());
  EXPECT_EQ(read.id(), "w0");  // nothing else touched
  EXPECT_EQ(read.message_overhead_seconds(), 0.000125);
  EXPECT_EQ(read.message_cpu_seconds(), 0.0000875);
  EXPECT_EQ(read.stream_hop_seconds(), 0.00031);
  EXPECT_EQ(read.message_cpu_seconds_per_byte(), 1.25e-9);
  EXPECT_EQ(read.host_cpus(), 2);
}

TEST(PlannerFigures, AFigureNotMeasuredHasNoGaugeAndStaysUnset) {
  v1::WorkerInfo info = Measured();
  info.clear_stream_hop_seconds();  // its measurement failed
  MetricsRegistry registry;
  ASSERT_TRUE(ExportPlannerFigures(info, &registry).ok());
  const std::string text = registry.RenderText();
  EXPECT_THAT(text, Not(HasSubstr("pipetrain_worker_stream_hop_seconds")));
  v1::WorkerInfo read;
  ASSERT_TRUE(ReadPlannerFigures(text, &read).ok());
  EXPECT_EQ(read.stream_hop_seconds(), 0);
  EXPECT_EQ(read.message_overhead_seconds(), 0.000125);
  // Other families and a similar name are not taken for the figures.
  v1::WorkerInfo other;
  ASSERT_TRUE(ReadPlannerFigures("pipetrain_worker_host_cpus_total 9\n"
                                 "pipetrain_stage_steps_total 4\n",
                                 &other)
                  .ok());
  EXPECT_EQ(other.host_cpus(), 0);
}

TEST(PlannerFigures, AMalformedValueIsAnErrorNamingTheGauge) {
  v1::WorkerInfo read;
  for (const char* text : {"pipetrain_worker_message_cpu_seconds abc\n",
                           "pipetrain_worker_message_cpu_seconds -1\n",
                           "pipetrain_worker_message_cpu_seconds NaN\n"}) {
    const absl::Status status = ReadPlannerFigures(text, &read);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(status.message(),
                HasSubstr("pipetrain_worker_message_cpu_seconds"));
  }
}

}  // namespace
}  // namespace pipetrain
