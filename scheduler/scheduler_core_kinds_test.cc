// SchedulerCore and worker kinds: a job is profiled on one worker of each
// kind among the candidates (worker_kinds.h), and planned by those
// profiles rather than by the workers' GEMM speeds.
#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler_core.h"
#include "scheduler/scheduler_core_test_fixture.h"

namespace pipetrain {
namespace testing_core {
namespace {

using ::testing::HasSubstr;

TEST_F(SchedulerCoreTest, EachWorkerKindIsProfiledOnItsOwnDevice) {
  Start();
  // Two workers of one kind (GEMM 10 and 12: noise) and one of another
  // (GEMM 40) on which the model runs at half speed.
  const std::string slow = "10.0.0.2:7000";
  AddWorkersAt({10, 12, 40});
  std::string slow_id;
  for (const auto& [id, address] : workers_) {
    if (address == slow) slow_id = id;
  }
  control_.SetProfileSlowdown(slow, 2.0);
  const v1::Job job = Submit(Spec(3, 6));
  core_->Tick();
  ASSERT_EQ(Job(job.id()).state(), v1::JOB_STATE_RUNNING)
      << Job(job.id()).error();

  // One profile per kind: the slow worker and one of the other two.
  const std::set<std::string> profiled =
      AddressSet(control_.CallsOf(Method::kProfile));
  EXPECT_EQ(control_.CallsOf(Method::kProfile).size(), 2u);
  EXPECT_EQ(profiled.count(slow), 1u);
  EXPECT_EQ(profiled.count("10.0.0.0:7000") + profiled.count("10.0.0.1:7000"),
            1u);

  // 6 layers of 3 ms at speeds 1, 1 and 0.5: the slow worker takes one
  // layer (6 ms), the others three and two (9 ms is the bottleneck). By
  // GEMM speed it would have taken the most.
  const v1::Plan plan = PlanOf(job.id());
  int slow_layers = -1;
  for (const v1::PlannedStage& s : plan.stages()) {
    if (s.worker_address() == slow) {
      slow_layers = s.layer_end() - s.layer_begin();
    }
  }
  EXPECT_EQ(slow_layers, 1) << plan.explanation();
  EXPECT_NEAR(plan.bottleneck_seconds(), 0.009, 1e-9) << plan.explanation();
  EXPECT_THAT(plan.explanation(), HasSubstr("profiled on " + slow_id));
}

TEST_F(SchedulerCoreTest, AKindWhoseProfileFailsIsPlannedAtItsGemmSpeed) {
  Start();
  AddWorkersAt({10, 10, 40});
  control_.FailNext(Method::kProfile, "10.0.0.2:7000",
                    absl::UnavailableError("connection refused"));
  const v1::Job job = Submit(Spec(3, 6));
  core_->Tick();
  ASSERT_EQ(Job(job.id()).state(), v1::JOB_STATE_RUNNING)
      << Job(job.id()).error();
  const v1::Plan plan = PlanOf(job.id());
  EXPECT_THAT(plan.explanation(), HasSubstr("(not profiled)"));
  EXPECT_THAT(plan.explanation(),
              HasSubstr("failed (UNAVAILABLE: connection refused); its kind "
                        "is planned at its GEMM speed"));
}

}  // namespace
}  // namespace testing_core
}  // namespace pipetrain
