#include "scheduler/recovery_plan.h"

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

v1::WorkerInfo Worker(const std::string& id) {
  v1::WorkerInfo w;
  w.set_id(id);
  w.set_address(id + ":7000");
  w.set_identity("cn-" + id);
  w.set_memory_bytes(1 << 20);
  w.set_state(v1::WORKER_STATE_ASSIGNED);
  w.set_job_id("job-1");
  return w;
}

v1::Plan ThreeStages() {
  v1::Plan plan;
  for (int s = 0; s < 3; ++s) {
    const v1::WorkerInfo w = Worker("w-" + std::to_string(s));
    v1::PlannedStage* p = plan.add_stages();
    p->set_stage(s);
    p->set_layer_begin(2 * s);
    p->set_layer_end(2 * s + 2);
    p->set_worker_id(w.id());
    p->set_worker_address(w.address());
    p->set_worker_identity(w.identity());
  }
  return plan;
}

TEST(RecoveryPlan, LostStagesAreThoseWhoseWorkerIsGoneLostOrReassigned) {
  std::map<std::string, v1::WorkerInfo> workers;
  workers["w-0"] = Worker("w-0");
  workers["w-2"] = Worker("w-2");
  workers["w-2"].set_state(v1::WORKER_STATE_LOST);
  EXPECT_EQ(LostStages(ThreeStages(), workers, "job-1"),
            (std::vector<int>{1, 2}));
  workers["w-1"] = Worker("w-1");
  workers["w-1"].clear_job_id();  // registered anew
  EXPECT_EQ(LostStages(ThreeStages(), workers, "job-1"),
            (std::vector<int>{1, 2}));
}

// The spare's own identity goes into the plan: the stage downstream of it
// admits only that identity's Exchange stream under mutual TLS.
TEST(RecoveryPlan, ASpareTakesTheLostStageWithItsOwnAddressAndIdentity) {
  const v1::WorkerInfo spare = Worker("w-9");
  const std::optional<v1::Plan> plan = WithSpares(ThreeStages(), {1}, {spare});
  ASSERT_TRUE(plan.has_value());
  const v1::PlannedStage& s = plan->stages(1);
  EXPECT_EQ(s.worker_id(), "w-9");
  EXPECT_EQ(s.worker_address(), "w-9:7000");
  EXPECT_EQ(s.worker_identity(), "cn-w-9");
  EXPECT_EQ(s.layer_begin(), 2);
  EXPECT_EQ(s.layer_end(), 4);
  EXPECT_EQ(plan->stages(0).worker_identity(), "cn-w-0");
  EXPECT_FALSE(WithSpares(ThreeStages(), {0, 1}, {spare}).has_value());
}

}  // namespace
}  // namespace pipetrain
