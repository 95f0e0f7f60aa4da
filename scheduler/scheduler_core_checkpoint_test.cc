// SchedulerCore's checkpoints: periodic (checkpoint_every), timed (every
// checkpoint_interval_seconds when checkpoint_every is 0), on request,
// retention, failed writes, and recovery from the latest checkpoint under
// the same cut and a new one.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/checkpoint_store.h"
#include "scheduler/scheduler_core.h"
#include "scheduler/scheduler_core_test_fixture.h"

namespace pipetrain {
namespace testing_core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class CheckpointTest : public SchedulerCoreTest {
 protected:
  void StartWithCatalog() {
    auto store = CheckpointStore::Open(dir_.path());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    checkpoints_ = store_.get();
    Start();
  }

  v1::Job RunningWith(int workers, int64_t steps, int64_t every, int keep = 0) {
    AddWorkers(workers);
    v1::JobSpec spec = Spec(3, steps);
    spec.mutable_training()->set_checkpoint_every(every);
    spec.mutable_training()->set_keep_checkpoints(keep);
    const v1::Job job = Submit(spec);
    core_->Tick();
    EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_RUNNING);
    return Job(job.id());
  }

  std::vector<int64_t> CheckpointSteps(const std::string& job_id) {
    v1::ListCheckpointsRequest r;
    r.set_job_id(job_id);
    auto list = core_->ListCheckpoints(r);
    EXPECT_TRUE(list.ok()) << list.status();
    std::vector<int64_t> out;
    if (list.ok()) {
      for (const auto& c : list->checkpoints()) out.push_back(c.step());
    }
    return out;
  }

  TempDir dir_;
  std::unique_ptr<CheckpointStore> store_;
};

TEST_F(CheckpointTest, EveryStageIsFetchedOnceAllPassedAMultiple) {
  StartWithCatalog();
  const v1::Job job = RunningWith(3, 12, 4);
  Train(3);
  EXPECT_TRUE(control_.CallsOf(Method::kFetchSnapshot).empty());
  Train(2);  // every stage is at step 5: boundary 4 is behind them all
  const auto fetches = control_.CallsOf(Method::kFetchSnapshot);
  ASSERT_EQ(fetches.size(), 3u);
  for (const auto& f : fetches) EXPECT_EQ(f.arg, 4);
  v1::ListCheckpointsRequest r;
  r.set_job_id(job.id());
  auto list = core_->ListCheckpoints(r);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->checkpoints_size(), 1);
  EXPECT_EQ(list->checkpoints(0).step(), 4);
  EXPECT_EQ(list->checkpoints(0).version(), 4);
  EXPECT_EQ(list->checkpoints(0).num_layers(), 6);
  // Every layer's state as the stages held it at that boundary.
  auto loaded = store_->Load(job.id(), 4);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->tensors.size(), 6u);
  for (int l = 0; l < 6; ++l) {
    EXPECT_EQ(loaded->tensors[l], FakeStageControl::LayerState(l, 4));
  }
  const v1::JobEvent last = *Job(job.id()).events().rbegin();
  EXPECT_EQ(last.kind(), v1::JOB_EVENT_CHECKPOINT);
  EXPECT_EQ(last.step(), 4);
  EXPECT_THAT(last.message(), HasSubstr("checkpoint 4 at step 4"));
  Train(1);  // nothing new is due
  EXPECT_EQ(control_.CallsOf(Method::kFetchSnapshot).size(), 3u);
  Train(3);
  Train(3);
  // 12 is the final step: taken when the job finishes.
  EXPECT_THAT(CheckpointSteps(job.id()), ElementsAre(4, 8, 12));
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_COMPLETED);
  EXPECT_THAT(metrics_.RenderText(),
              HasSubstr("pipetrain_scheduler_checkpoints_total 3"));
}

TEST_F(CheckpointTest, OnlyTheNewestKeepCheckpointsStay) {
  StartWithCatalog();
  const v1::Job job = RunningWith(3, 20, 2, /*keep=*/2);
  for (int i = 0; i < 8; ++i) Train(1);
  EXPECT_THAT(CheckpointSteps(job.id()), ElementsAre(6, 8));
}

TEST_F(CheckpointTest, AFailedFetchCommitsNothingAndTheNextOneIsTaken) {
  StartWithCatalog();
  const v1::Job job = RunningWith(3, 12, 3);
  control_.FailNext(Method::kFetchSnapshot, "",
                    absl::UnavailableError("connection reset"));
  Train(4);
  EXPECT_TRUE(CheckpointSteps(job.id()).empty());
  Train(3);
  EXPECT_THAT(CheckpointSteps(job.id()), ElementsAre(6));
}

TEST_F(CheckpointTest, WithoutCheckpointEveryTheSchedulerAsksOnATimer) {
  StartWithCatalog();
  const v1::Job job = RunningWith(3, 20, 0);
  Train(2);
  EXPECT_TRUE(control_.CallsOf(Method::kSnapshot).empty());
  now_ms_ += 61'000;
  Heartbeats();  // keeps the leases fresh
  core_->Tick();
  const auto asks = control_.CallsOf(Method::kSnapshot);
  ASSERT_EQ(asks.size(), 3u);
  EXPECT_EQ(asks[0].arg, 4);  // stage 0 reported step 2; a little ahead
  Train(3);
  EXPECT_THAT(CheckpointSteps(job.id()), ElementsAre(4));
}

TEST_F(CheckpointTest, AUserCanAskForOneAndNeverMeansNoPeriodicOnes) {
  StartWithCatalog();
  const v1::Job job = RunningWith(3, 20, -1);
  Train(2);
  now_ms_ += 120'000;
  Train(1);
  EXPECT_TRUE(control_.CallsOf(Method::kSnapshot).empty());
  v1::CheckpointJobRequest r;
  r.set_job_id(job.id());
  auto asked = core_->CheckpointJob(r);
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_EQ(asked->step(), 5);
  EXPECT_TRUE(absl::IsUnavailable(core_->CheckpointJob(r).status()));
  Train(3);
  EXPECT_THAT(CheckpointSteps(job.id()), ElementsAre(5));
  r.set_job_id("job-9");
  EXPECT_TRUE(absl::IsNotFound(core_->CheckpointJob(r).status()));
}

TEST_F(CheckpointTest, ASpareResumesFromTheLatestCheckpoint) {
  StartWithCatalog();
  const v1::Job job = RunningWith(4, 12, 4);
  Train(7);  // checkpoint at 4, stages at 7
  ASSERT_THAT(CheckpointSteps(job.id()), ElementsAre(4));
  const size_t configured = control_.CallsOf(Method::kConfigure).size();
  KillStage(job.id(), 1);
  const auto again = ConfiguresSince(configured);
  ASSERT_EQ(again.size(), 3u);
  for (const auto& c : again) {
    EXPECT_EQ(c.config.start_step(), 4);
    EXPECT_TRUE(c.config.restore_expected());
  }
  // The fake refuses a restore without exactly its layers' state of step 4.
  const auto restores = control_.CallsOf(Method::kRestoreState);
  ASSERT_EQ(restores.size(), 3u);
  for (const auto& c : again) {
    EXPECT_EQ(control_.StageAt(c.address).restored_tensors,
              c.config.layer_end() - c.config.layer_begin());
  }
  const v1::Job recovering = Job(job.id());
  ASSERT_EQ(recovering.state(), v1::JOB_STATE_RUNNING) << recovering.error();
  EXPECT_EQ(recovering.step(), 4);
  ASSERT_EQ(recovering.rollbacks_size(), 1);
  EXPECT_EQ(recovering.rollbacks(0).from_step(), 7);
  EXPECT_EQ(recovering.rollbacks(0).to_step(), 4);
  EXPECT_EQ(recovering.rollbacks(0).version(), 4);
  Train(1);
  EXPECT_EQ(Job(job.id()).events().rbegin()->kind(), v1::JOB_EVENT_RECOVERED);
  Train(8);
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_COMPLETED);
}

TEST_F(CheckpointTest, AReplannedJobReloadsEveryLayerUnderTheNewCut) {
  StartWithCatalog();
  const v1::Job job = RunningWith(3, 12, 4);
  Train(6);
  KillStage(job.id(), 0);
  const v1::Plan plan = PlanOf(job.id());
  ASSERT_EQ(plan.stages_size(), 2);
  for (const auto& s : plan.stages()) {
    EXPECT_EQ(control_.StageAt(s.worker_address()).restored_tensors,
              s.layer_end() - s.layer_begin());
    EXPECT_EQ(control_.StageAt(s.worker_address()).next_step, 4);
  }
  Train(8);
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_COMPLETED);
}

}  // namespace
}  // namespace testing_core
}  // namespace pipetrain
