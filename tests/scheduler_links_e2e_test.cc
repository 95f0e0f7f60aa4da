// Link probes through a real scheduler and three worker processes on
// loopback: the workers measure each other when they register and report
// the links in their heartbeats; ListWorkers (gRPC and REST) shows the
// matrix, and a job's plan carries each stage's link, the bytes it sends
// per micro-batch and, once steps ran, the measured step beside the
// predicted one.
#include <chrono>
#include <thread>

#include "common/logging.h"
#include "common/proto_json.h"
#include "gtest/gtest.h"
#include "services/http/test_http_client.h"
#include "tests/scheduler_cluster.h"

namespace pipetrain::testing {
namespace {

using testing_http::Send;

// Every worker's measured links (source "probe") to the others.
int MeasuredLinks(const v1::ListWorkersResponse& workers) {
  int n = 0;
  for (const v1::WorkerInfo& w : workers.workers()) {
    for (const v1::LinkMeasurement& l : w.links()) {
      n += l.source() == "probe" && l.bandwidth_bytes_per_s() > 0 &&
           l.rtt_seconds() > 0;
    }
  }
  return n;
}

TEST_F(SchedulerTest, WorkersReportTheirLinksAndPlansUseThem) {
  ASSERT_TRUE(WaitForWorkers(3, v1::WORKER_STATE_IDLE));
  v1::ListWorkersResponse workers;
  for (int i = 0; i < 200; ++i) {
    workers = ListWorkers();
    if (MeasuredLinks(workers) == 6) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(MeasuredLinks(workers), 6) << ToJsonString(workers);
  for (const v1::WorkerInfo& w : workers.workers()) {
    for (const v1::LinkMeasurement& l : w.links()) {
      EXPECT_NE(l.to_worker_id(), w.id());
      // Loopback: well above 10 MB/s, well under a second round trip.
      EXPECT_GT(l.bandwidth_bytes_per_s(), 1e7) << ToJsonString(l);
      EXPECT_LT(l.rtt_seconds(), 1.0) << ToJsonString(l);
    }
  }
  // REST shows the same matrix through the JSON mapping.
  auto listed = Send(scheduler_.http_port, "GET", "/v1/workers");
  ASSERT_TRUE(listed.ok()) << listed.status();
  v1::ListWorkersResponse rest;
  ASSERT_TRUE(ParseJson(listed->body, &rest).ok()) << listed->body;
  EXPECT_EQ(MeasuredLinks(rest), 6) << listed->body;

  v1::JobSpec spec;
  *spec.mutable_training() = MlpSpec(20);
  spec.set_num_stages(3);
  const v1::Job job = Submit(spec);
  const v1::Job done = WaitForState(job.id(), v1::JOB_STATE_COMPLETED);
  ASSERT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.error();
  const v1::Plan plan = GetPlan(job.id());
  ASSERT_EQ(plan.stages_size(), 3);
  for (int s = 0; s < 2; ++s) {
    EXPECT_GT(plan.stages(s).link_bandwidth_bytes_per_s(), 1e7);
    EXPECT_GT(plan.stages(s).link_rtt_seconds(), 0);
    EXPECT_GT(plan.stages(s).wire_bytes_per_micro_batch(), 0);
  }
  EXPECT_EQ(plan.stages(2).link_bandwidth_bytes_per_s(), 0);
  EXPECT_NE(plan.explanation().find("(probe)"), std::string::npos)
      << plan.explanation();
  EXPECT_GT(plan.predicted_step_seconds(), 0);
  EXPECT_GT(plan.measured_step_seconds(), 0);
  EXPECT_GT(plan.measured_steps(), 0);
  PT_LOG(INFO) << "predicted step " << plan.predicted_step_seconds() * 1e3
               << " ms, measured " << plan.measured_step_seconds() * 1e3
               << " ms over " << plan.measured_steps() << " steps";
}

}  // namespace
}  // namespace pipetrain::testing
