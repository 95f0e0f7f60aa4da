// SchedulerCore's initFrom over FakeStageControl: a job continuing from
// another job's checkpoint is configured at that step and restored from it
// (under another cut), its source pinned; a recovery before its own first
// checkpoint reloads the source; a finished job commits its final step.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/checkpoint_store.h"
#include "scheduler/scheduler_core.h"
#include "scheduler/scheduler_core_test_fixture.h"

namespace pipetrain {
namespace testing_core {
namespace {

using ::testing::HasSubstr;

class InitFromTest : public SchedulerCoreTest {
 protected:
  void SetUp() override {
    SchedulerCoreTest::SetUp();
    auto store = CheckpointStore::Open(dir_.path());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    checkpoints_ = store_.get();
    Start();
    AddWorkers(3);
  }

  // A 3-stage job of `steps` steps (checkpoints on the default timer, which
  // the fake clock never reaches), run to completion: its final checkpoint
  // is its only one.
  v1::Job Finished(int64_t steps) {
    v1::JobSpec spec = Spec(3, steps);
    const v1::Job job = Submit(spec);
    core_->Tick();
    Train(steps);
    Train(0);
    EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_COMPLETED);
    return Job(job.id());
  }

  TempDir dir_;
  std::unique_ptr<CheckpointStore> store_;
};

TEST_F(InitFromTest, AFinishedJobCommitsItsFinalStep) {
  const v1::Job done = Finished(6);
  auto latest = store_->Latest(done.id());
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step, 6);
  EXPECT_THAT(done.events().rbegin()[1].message(),
              HasSubstr("checkpoint 6 at step 6"));
}

TEST_F(InitFromTest, AContinuedJobStartsAtTheCheckpointUnderANewCut) {
  const v1::Job first = Finished(6);
  const size_t configured = control_.CallsOf(Method::kConfigure).size();
  v1::JobSpec spec = Spec(2, 10);
  spec.mutable_training()->set_init_from("job:" + first.id());
  const v1::Job job = Submit(spec);
  core_->Tick();
  const v1::Job running = Job(job.id());
  ASSERT_EQ(running.state(), v1::JOB_STATE_RUNNING) << running.error();
  EXPECT_EQ(running.step(), 6);
  EXPECT_EQ(running.spec().training().init_from(), "job:" + first.id() + "@6");
  const auto configs = ConfiguresSince(configured);
  ASSERT_EQ(configs.size(), 2u);
  for (const auto& c : configs) {
    EXPECT_EQ(c.config.start_step(), 6);
    EXPECT_TRUE(c.config.restore_expected());
  }
  for (const auto& r : control_.CallsOf(Method::kRestoreState)) {
    if (r.job_id == job.id()) {
      EXPECT_EQ(r.arg, 6);
    }
  }
  // Lost before its own first checkpoint: it resumes from the source.
  const size_t before = control_.CallsOf(Method::kConfigure).size();
  KillStage(job.id(), 1);
  const auto again = ConfiguresSince(before);
  ASSERT_FALSE(again.empty());
  for (const auto& c : again) EXPECT_EQ(c.config.start_step(), 6);
  Train(4);
  Train(0);
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_COMPLETED);
}

TEST_F(InitFromTest, BadSourcesAreRefusedAtSubmit) {
  const v1::Job first = Finished(6);
  auto submit = [&](const std::string& init_from, int64_t steps, int layers) {
    v1::JobSpec spec = Spec(2, steps);
    spec.mutable_training()->mutable_model()->clear_layers();
    for (int l = 0; l < layers; ++l) {
      spec.mutable_training()->mutable_model()->add_layers();
    }
    spec.mutable_training()->set_init_from(init_from);
    v1::SubmitJobRequest r;
    *r.mutable_spec() = spec;
    return core_->SubmitJob(r).status();
  };
  const std::string src = "job:" + first.id();
  absl::Status s = submit("job:nobody", 10, 6);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("init_from \"job:nobody\": no job"));
  s = submit(src + "@5", 10, 6);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("no committed checkpoint of version 5 "
                                     "(committed: 6)"));
  s = submit(src, 10, 7);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("the saved model has 6 layers"));
  s = submit(src, 6, 6);
  EXPECT_THAT(s.message(), HasSubstr("leaves nothing to train"));
  // This core has no models directory: no file may be read.
  s = submit("model.safetensors", 10, 6);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("reads no model files"));
}

}  // namespace
}  // namespace testing_core
}  // namespace pipetrain
