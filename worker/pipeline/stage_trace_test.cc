// The trace window: bounded by steps and by events, filtered by step, and
// converted to TraceEvents with the schedule's short op names.
#include "worker/pipeline/stage_trace.h"

#include <thread>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TraceRecord Record(int64_t step, OpKind op, int mb) {
  TraceRecord r;
  r.step = step;
  r.instruction = {op, mb, 0};
  r.weight_version = step;
  r.start_unix_us = 1000 * step + mb;
  r.end_unix_us = r.start_unix_us + 1;
  return r;
}

TEST(StageTrace, ConvertsRecordsToEvents) {
  StageTrace trace(/*stage=*/2);
  trace.Record(Record(0, OpKind::kForward, 1));
  TraceRecord bi = Record(0, OpKind::kBackwardInput, 1);
  bi.instruction.chunk = 1;
  trace.Record(bi);
  trace.Record(Record(0, OpKind::kOptimizerStep, 0));
  const v1::GetTraceResponse got = trace.Since(0);
  ASSERT_EQ(got.events_size(), 3);
  EXPECT_EQ(got.events(0).op(), "F");
  EXPECT_EQ(got.events(1).op(), "BI");
  EXPECT_EQ(got.events(1).chunk(), 1);
  EXPECT_EQ(got.events(2).op(), "Step");
  for (const v1::TraceEvent& e : got.events()) {
    EXPECT_EQ(e.stage(), 2);
    EXPECT_EQ(e.step(), 0);
  }
  EXPECT_EQ(got.events(0).micro_batch(), 1);
  EXPECT_EQ(got.events(0).start_unix_us(), 1);
  EXPECT_EQ(got.events(0).end_unix_us(), 2);
}

TEST(StageTrace, SinceStepFilters) {
  StageTrace trace(0);
  for (int64_t step = 0; step < 5; ++step) {
    for (int mb = 0; mb < 3; ++mb)
      trace.Record(Record(step, OpKind::kForward, mb));
  }
  EXPECT_EQ(trace.Since(0).events_size(), 15);
  const v1::GetTraceResponse late = trace.Since(3);
  ASSERT_EQ(late.events_size(), 6);
  EXPECT_EQ(late.events(0).step(), 3);
  EXPECT_EQ(late.events(5).step(), 4);
  EXPECT_EQ(trace.Since(5).events_size(), 0);
}

TEST(StageTrace, KeepsTheLastStepsAndAtMostMaxEvents) {
  StageTrace by_steps(0, /*max_steps=*/3, /*max_events=*/1000);
  for (int64_t step = 0; step < 10; ++step) {
    for (int mb = 0; mb < 4; ++mb)
      by_steps.Record(Record(step, OpKind::kForward, mb));
  }
  const v1::GetTraceResponse steps = by_steps.Since(0);
  ASSERT_EQ(steps.events_size(), 12);
  EXPECT_EQ(steps.events(0).step(), 7);

  StageTrace by_events(0, /*max_steps=*/64, /*max_events=*/10);
  for (int64_t step = 0; step < 10; ++step) {
    for (int mb = 0; mb < 4; ++mb)
      by_events.Record(Record(step, OpKind::kForward, mb));
  }
  const v1::GetTraceResponse events = by_events.Since(0);
  ASSERT_EQ(events.events_size(), 10);
  EXPECT_EQ(events.events(0).step(), 7);
  EXPECT_EQ(events.events(0).micro_batch(), 2);
  EXPECT_EQ(events.events(9).step(), 9);
  EXPECT_EQ(events.events(9).micro_batch(), 3);
}

TEST(StageTrace, ReadersRunBesideTheWriter) {
  StageTrace trace(0, 4, 100);
  std::thread writer([&] {
    for (int64_t step = 0; step < 2000; ++step) {
      trace.Record(Record(step, OpKind::kForward, 0));
    }
  });
  // Every snapshot is a consistent window: at most 4 consecutive steps,
  // and it never moves backwards.
  int64_t oldest = -1;
  for (int i = 0; i < 200; ++i) {
    const v1::GetTraceResponse got = trace.Since(0);
    ASSERT_LE(got.events_size(), 4);
    for (int e = 1; e < got.events_size(); ++e) {
      EXPECT_EQ(got.events(e).step(), got.events(e - 1).step() + 1);
    }
    if (got.events_size() > 0) {
      EXPECT_GE(got.events(0).step(), oldest);
      oldest = got.events(0).step();
    }
  }
  writer.join();
  EXPECT_EQ(trace.Since(0).events(3).step(), 1999);
}

TEST(StageTrace, NowIsMicrosecondsSinceTheEpoch) {
  const int64_t now = StageTrace::NowUnixMicros();
  EXPECT_GT(now, int64_t{1600000000} * 1000000);  // after 2020
  EXPECT_LT(now, int64_t{4100000000} * 1000000);  // before 2100
}

}  // namespace
}  // namespace pipetrain
