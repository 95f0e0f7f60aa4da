// SchedulerCore and link probes: heartbeats ask workers to measure their
// peers and carry the results back into ListWorkers; a plan uses the
// measured links, and one made before every link was measured says so.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler_core.h"
#include "scheduler/scheduler_core_test_fixture.h"

namespace pipetrain {
namespace testing_core {
namespace {

using ::testing::HasSubstr;

TEST_F(SchedulerCoreTest, HeartbeatsAskForProbesAndCarryLinksBack) {
  Start();
  AddWorkers(2);
  const std::vector<std::string> ids = {workers_.begin()->first,
                                        workers_.rbegin()->first};
  v1::HeartbeatRequest beat;
  beat.set_worker_id(ids[0]);
  // AddWorkers' heartbeats already asked the first worker; it has not
  // answered, so it is not asked again yet.
  absl::StatusOr<v1::HeartbeatResponse> answer = core_->Heartbeat(beat);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->probe_size(), 0);
  v1::LinkMeasurement* link = beat.add_links();
  link->set_to_worker_id(ids[1]);
  link->set_bandwidth_bytes_per_s(2.5e8);
  link->set_rtt_seconds(0.004);
  link->set_source("probe");
  ASSERT_TRUE(core_->Heartbeat(beat).ok());
  // Now the second worker measures its link back.
  v1::HeartbeatRequest other;
  other.set_worker_id(ids[1]);
  answer = core_->Heartbeat(other);
  ASSERT_TRUE(answer.ok());
  ASSERT_EQ(answer->probe_size(), 1);
  EXPECT_EQ(answer->probe(0).worker_id(), ids[0]);
  EXPECT_EQ(answer->probe(0).address(), workers_[ids[0]]);

  auto listed = core_->ListWorkers(v1::ListWorkersRequest());
  ASSERT_TRUE(listed.ok());
  for (const v1::WorkerInfo& w : listed->workers()) {
    if (w.id() != ids[0]) {
      EXPECT_EQ(w.links_size(), 0);
      continue;
    }
    ASSERT_EQ(w.links_size(), 1);
    EXPECT_EQ(w.links(0).to_worker_id(), ids[1]);
    EXPECT_EQ(w.links(0).bandwidth_bytes_per_s(), 2.5e8);
    EXPECT_EQ(w.links(0).source(), "probe");
  }
}

TEST_F(SchedulerCoreTest,
       PlansWithoutWaitingForeverAndSaySoWhenLinksAreMissing) {
  Start();
  AddWorkers(3);  // fake workers never answer probes
  const v1::Job job = Submit(Spec(3, 6));
  core_->Tick();
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_RUNNING);
  v1::GetPlanRequest r;
  r.set_job_id(job.id());
  absl::StatusOr<v1::Plan> plan = core_->GetPlan(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->explanation(),
              HasSubstr("links: 6 of 6 not measured after waiting"));
  EXPECT_THAT(plan->explanation(), HasSubstr("(default)"));
  // The steps the stages reported so far, beside the prediction.
  EXPECT_EQ(plan->measured_steps(), 0);
  Train(3);
  plan = core_->GetPlan(r);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->measured_steps(), 3);
  EXPECT_DOUBLE_EQ(plan->measured_step_seconds(), 0.5);  // the fake's
}

}  // namespace
}  // namespace testing_core
}  // namespace pipetrain
