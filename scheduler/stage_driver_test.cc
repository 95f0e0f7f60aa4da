#include "scheduler/stage_driver.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/fake_stage_control.h"

namespace pipetrain {
namespace {

using Method = FakeStageControl::Method;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::Plan ThreeStages() {
  v1::Plan plan;
  for (int s = 0; s < 3; ++s) {
    v1::PlannedStage* p = plan.add_stages();
    p->set_stage(s);
    p->set_layer_begin(2 * s);
    p->set_layer_end(2 * s + 2);
    p->set_worker_address("s" + std::to_string(s));
  }
  return plan;
}

std::vector<std::string> Addresses(
    const std::vector<FakeStageControl::Call>& calls) {
  std::vector<std::string> out;
  for (const auto& c : calls) out.push_back(c.address);
  return out;
}

TEST(StageConfigsTest, InterleavedStagesLinkAroundTheRing) {
  v1::Plan plan = ThreeStages();
  v1::JobSpec spec;
  spec.set_schedule(v1::SCHEDULE_GPIPE);
  auto configs = StageConfigs("job-1", spec, plan, 7.5);
  ASSERT_EQ(configs.size(), 3u);
  EXPECT_EQ(configs[0].downstream(), "s1");
  EXPECT_EQ(configs[2].downstream(), "");
  EXPECT_EQ(configs[1].layer_begin(), 2);
  EXPECT_EQ(configs[1].num_stages(), 3);
  EXPECT_EQ(configs[1].recv_timeout_s(), 7.5);
  EXPECT_EQ(configs[1].extra_warmup(), 0);
  // The stages run the plan's extra warm-up (the planner's choice when the
  // spec asks for auto, -1), not the spec's.
  spec.set_schedule(v1::SCHEDULE_2BW);
  spec.set_extra_warmup(-1);
  plan.set_extra_warmup(3);
  configs = StageConfigs("job-1", spec, plan, 7.5);
  for (const v1::StageConfig& c : configs) EXPECT_EQ(c.extra_warmup(), 3);
  plan.set_extra_warmup(0);

  for (v1::PlannedStage& s : *plan.mutable_stages()) {
    for (int c = 0; c < 2; ++c) {
      v1::LayerRange* r = s.add_chunks();
      r->set_begin(c * 3 + s.stage());
      r->set_end(c * 3 + s.stage() + 1);
    }
  }
  spec.set_schedule(v1::SCHEDULE_INTERLEAVED);
  configs = StageConfigs("job-1", spec, plan, 7.5);
  EXPECT_EQ(configs[2].downstream(), "s0");
  EXPECT_EQ(configs[2].virtual_stages(), 2);
  EXPECT_EQ(configs[2].chunks(1).begin(), 5);
}

TEST(LaunchStagesTest, ConfiguresThenTrainsLastFirstForTheEpochsSteps) {
  FakeStageControl control;
  control.SetStepsPerEpoch(25);
  v1::JobSpec spec;
  spec.mutable_training()->set_epochs(2);
  auto total = LaunchStages(&control, "job-1", spec, ThreeStages(), 60);
  ASSERT_TRUE(total.ok()) << total.status();
  EXPECT_EQ(*total, 50);
  EXPECT_THAT(Addresses(control.calls()),
              ElementsAre("s2", "s1", "s0", "s2", "s1", "s0"));
  EXPECT_EQ(control.CallsOf(Method::kTrain)[0].arg, 50);

  FakeStageControl refusing;
  refusing.FailNext(Method::kConfigure, "s1",
                    absl::InvalidArgumentError("bad layer range"));
  total = LaunchStages(&refusing, "job-1", spec, ThreeStages(), 60);
  EXPECT_TRUE(absl::IsInvalidArgument(total.status()));
  EXPECT_EQ(total.status().message(), "stage 1 (s1): bad layer range");
  EXPECT_TRUE(refusing.CallsOf(Method::kTrain).empty());
}

TEST(PauseAndResumeTest, StageZeroLeadsThePauseAndResumeGoesLastFirst) {
  FakeStageControl control;
  v1::JobSpec spec;
  spec.mutable_training()->set_steps(10);
  ASSERT_TRUE(LaunchStages(&control, "job-1", spec, ThreeStages(), 60).ok());
  control.Advance(4);
  const std::vector<std::string> a = {"s0", "s1", "s2"};
  auto target = PauseStages(&control, a, "job-1");
  ASSERT_TRUE(target.ok());
  EXPECT_EQ(*target, 5);  // after the step in progress
  auto trains = control.CallsOf(Method::kTrain);
  EXPECT_THAT(Addresses({trains.begin() + 3, trains.end()}),
              ElementsAre("s0", "s1", "s2"));
  EXPECT_EQ(trains[4].arg, 5);
  EXPECT_TRUE(ResumeStages(&control, a, "job-1", 10).ok());
  trains = control.CallsOf(Method::kTrain);
  EXPECT_THAT(Addresses({trains.begin() + 6, trains.end()}),
              ElementsAre("s2", "s1", "s0"));
  control.Advance(10);
  EXPECT_EQ(control.StageAt("s1").next_step, 10);
}

// Stages as the executor has them mid-pause: stage 0 has finished step 4
// and stops at 5 when asked for less, while stage 1 is already inside step 5
// (waiting for its activations) and cannot stop before 6. Any target it is
// given that is at least what it can do is taken.
class SkewedStages : public StageControl {
 public:
  absl::StatusOr<v1::ProfileResponse> Profile(
      const std::string&, const v1::ProfileRequest&) override {
    return absl::UnimplementedError("not called by the pause test");
  }
  absl::StatusOr<v1::ConfigureResponse> Configure(
      const std::string&, const v1::StageConfig&) override {
    return absl::UnimplementedError("not called by the pause test");
  }
  absl::StatusOr<int64_t> Train(const std::string& address, const std::string&,
                                int64_t until_step) override {
    const int64_t least = address == "s1" ? 6 : 5;
    targets[address] = std::max(until_step, least);
    return targets[address];
  }
  absl::Status Stop(const std::string&, const std::string&) override {
    return absl::OkStatus();
  }
  absl::StatusOr<v1::EvalResult> Evaluate(const std::string&,
                                          const std::string&,
                                          int64_t) override {
    return absl::UnimplementedError("not called by the pause test");
  }
  absl::StatusOr<v1::GetTraceResponse> GetTrace(const std::string&,
                                                const std::string&,
                                                int64_t) override {
    return absl::UnimplementedError("not called by the pause test");
  }
  absl::StatusOr<int64_t> Snapshot(const std::string&, const std::string&,
                                   int64_t) override {
    return absl::UnimplementedError("not called by the pause test");
  }
  absl::Status FetchSnapshot(const std::string&, const std::string&, int64_t,
                             const StageStateSink&) override {
    return absl::UnimplementedError("not called by the pause test");
  }
  absl::StatusOr<int64_t> RestoreState(
      const std::string&, const std::string&, const StageStateInfo&,
      const std::vector<StateTensor>&) override {
    return absl::UnimplementedError("not called by the pause test");
  }
  std::map<std::string, int64_t> targets;
};

TEST(PauseAndResumeTest, EveryStageStopsAtTheSameStepWhenOneIsAhead) {
  SkewedStages control;
  auto target = PauseStages(&control, {"s0", "s1", "s2"}, "job-1");
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ(*target, 6);
  EXPECT_EQ(control.targets["s0"], 6);
  EXPECT_EQ(control.targets["s1"], 6);
  EXPECT_EQ(control.targets["s2"], 6);
}

TEST(StopStagesTest, StopsEveryStageEvenWhenOneIsGone) {
  FakeStageControl control;
  v1::JobSpec spec;
  spec.mutable_training()->set_steps(10);
  ASSERT_TRUE(LaunchStages(&control, "job-1", spec, ThreeStages(), 60).ok());
  control.FailNext(Method::kStop, "s0", absl::UnavailableError("gone"));
  StopStages(&control, {"s0", "s1", "s2"}, "job-1");
  EXPECT_THAT(Addresses(control.CallsOf(Method::kStop)),
              ElementsAre("s0", "s1", "s2"));
  EXPECT_TRUE(control.StageAt("s2").job_id.empty());
}

TEST(EvaluateStagesTest, CallsEveryStageAtOnceAndReturnsTheLastOnesResult) {
  FakeStageControl control;
  v1::JobSpec spec;
  spec.mutable_training()->set_steps(3);
  ASSERT_TRUE(LaunchStages(&control, "job-1", spec, ThreeStages(), 60).ok());
  control.Advance(3);
  v1::EvalResult want;
  want.set_loss(0.5);
  want.set_accuracy(0.75);
  want.set_samples(64);
  control.SetEvalResult(want);
  // Stages answer only once all three are evaluating.
  control.SetEvaluateWait(std::chrono::seconds(10));
  auto got = EvaluateStages(&control, {"s0", "s1", "s2"}, "job-1", 64);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->loss(), 0.5);
  EXPECT_EQ(got->accuracy(), 0.75);
  EXPECT_EQ(got->step(), 3);
  EXPECT_EQ(control.CallsOf(Method::kEvaluate).size(), 3u);

  control.FailNext(Method::kEvaluate, "s2",
                   absl::FailedPreconditionError("stage is training"));
  control.FailNext(Method::kEvaluate, "s1", absl::UnavailableError("reset"));
  got = EvaluateStages(&control, {"s0", "s1", "s2"}, "job-1", 64);
  EXPECT_TRUE(absl::IsUnavailable(got.status())) << got.status();
  EXPECT_EQ(got.status().message(),
            "stage 1 (s1): reset; stage 2 (s2): stage is training");
}

TEST(CollectTracesTest, GathersEveryStagesEvents) {
  FakeStageControl control;
  v1::JobSpec spec;
  spec.mutable_training()->set_steps(3);
  ASSERT_TRUE(LaunchStages(&control, "job-1", spec, ThreeStages(), 60).ok());
  for (int s = 0; s < 3; ++s) {
    v1::TraceEvent old, recent;
    old.set_stage(s);
    old.set_step(0);
    recent.set_stage(s);
    recent.set_step(2);
    control.SetTrace("s" + std::to_string(s), {old, recent});
  }
  auto events = CollectTraces(&control, ThreeStages(), "job-1", 1);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 3u);
  EXPECT_EQ((*events)[2].stage(), 2);
  EXPECT_EQ(control.CallsOf(Method::kGetTrace)[0].arg, 1);
}

}  // namespace
}  // namespace pipetrain
