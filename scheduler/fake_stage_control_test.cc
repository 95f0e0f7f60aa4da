// The fake's checkpoint behaviour, which the recovery tests rely on: it
// must refuse what a real stage refuses, or those tests prove nothing.
#include "scheduler/fake_stage_control.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::StageConfig Config(int begin, int end, int64_t start, bool restore) {
  v1::StageConfig c;
  c.set_job_id("job-1");
  c.set_num_stages(1);
  c.set_layer_begin(begin);
  c.set_layer_end(end);
  c.set_start_step(start);
  c.set_restore_expected(restore);
  c.mutable_spec()->set_checkpoint_every(4);
  return c;
}

TEST(FakeStageControlTest, SnapshotsAtAskedAndPeriodicBoundariesKeepTwo) {
  FakeStageControl f;
  ASSERT_TRUE(f.Configure("a", Config(1, 3, 0, false)).ok());
  ASSERT_TRUE(f.Train("a", "job-1", 20).ok());
  EXPECT_EQ(*f.Snapshot("a", "job-1", 3), 3);
  f.Advance(5);
  EXPECT_THAT(f.StageAt("a").snapshots, ElementsAre(3, 4));
  EXPECT_TRUE(absl::IsFailedPrecondition(f.Snapshot("a", "job-1", 2).status()));
  f.Advance(4);  // boundary 8 drops 3
  EXPECT_THAT(f.StageAt("a").snapshots, ElementsAre(4, 8));
  EXPECT_TRUE(absl::IsNotFound(f.FetchSnapshot(
      "a", "job-1", 3,
      [](const StageStateInfo&, StateTensor) { return absl::OkStatus(); })));
  std::vector<std::string> names;
  ASSERT_TRUE(f.FetchSnapshot("a", "job-1", 8,
                              [&](const StageStateInfo& info, StateTensor t) {
                                EXPECT_EQ(info.step, 8);
                                EXPECT_EQ(
                                    t.data,
                                    FakeStageControl::LayerState(
                                        t.name == "layers.1.weight" ? 1 : 2, 8)
                                        .data);
                                names.push_back(t.name);
                                return absl::OkStatus();
                              })
                  .ok());
  EXPECT_THAT(names, ElementsAre("layers.1.weight", "layers.2.weight"));
}

TEST(FakeStageControlTest, ARestoringStageTrainsOnlyWithItsLayersOfItsStep) {
  FakeStageControl f;
  ASSERT_TRUE(f.Configure("a", Config(0, 2, 4, true)).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(f.Train("a", "job-1", 9).status()));
  const auto wrong = f.RestoreState(
      "a", "job-1", {4, 4, 4},
      {FakeStageControl::LayerState(0, 4), FakeStageControl::LayerState(1, 3)});
  EXPECT_THAT(wrong.status().message(), HasSubstr("not the state of step 4"));
  const auto missing = f.RestoreState("a", "job-1", {4, 4, 4},
                                      {FakeStageControl::LayerState(0, 4)});
  EXPECT_THAT(missing.status().message(), HasSubstr("missing layers.1.weight"));
  const auto ok = f.RestoreState(
      "a", "job-1", {4, 4, 4},
      {FakeStageControl::LayerState(0, 4), FakeStageControl::LayerState(1, 4),
       FakeStageControl::LayerState(5, 4)});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, 2);
  EXPECT_TRUE(f.Train("a", "job-1", 9).ok());
  f.Advance(2);
  EXPECT_EQ(f.StageAt("a").next_step, 6);
}

TEST(FakeStageControlTest, AKilledWorkerAnswersNothing) {
  FakeStageControl f;
  ASSERT_TRUE(f.Configure("a", Config(0, 2, 0, false)).ok());
  f.Kill("a");
  EXPECT_TRUE(absl::IsUnavailable(f.Train("a", "job-1", 3).status()));
  EXPECT_FALSE(f.Report("a").has_value());
  f.Revive("a");
  EXPECT_TRUE(f.Configure("a", Config(0, 2, 0, false)).ok());
}

}  // namespace
}  // namespace pipetrain
