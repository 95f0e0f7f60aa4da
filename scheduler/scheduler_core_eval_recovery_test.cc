// SchedulerCore's recovery of a job whose end-of-job evaluation failed: a
// worker lost while the finished stages evaluate is replaced (a spare) and
// every stage is restored from the final checkpoint, so nothing is trained
// again, and the job is evaluated again and completes; without the final
// checkpoint the last periodic one is trained on from; a stage's own
// evaluation error is recovered a lease later; with checkpoints on but none
// committed yet every step is trained again; with checkpoints off, or once
// the restarts are spent, the job fails saying why.
#include <memory>
#include <set>
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

constexpr int64_t kSteps = 8;
constexpr int64_t kEvery = 4;

class EvalRecoveryTest : public SchedulerCoreTest {
 protected:
  void StartWithCatalog() {
    auto store = CheckpointStore::Open(dir_.path());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    checkpoints_ = store_.get();
    Start();
  }

  // A 3-stage job of kSteps steps checkpointing every `every` steps, on
  // `workers` workers, trained to its last step but one.
  v1::Job AlmostDone(int workers, int64_t every, int max_restarts = 0) {
    AddWorkers(workers);
    v1::JobSpec spec = Spec(3, kSteps);
    spec.mutable_training()->set_checkpoint_every(every);
    spec.mutable_training()->set_max_restarts(max_restarts);
    const v1::Job job = Submit(spec);
    core_->Tick();
    EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_RUNNING);
    Train(kSteps - 1);
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

  // The fake clock moves past the grace a failed evaluation waits for its
  // cause, every worker heartbeating meanwhile (none is lost).
  void PassTheGrace() {
    now_ms_ += kLeaseMs / 2;
    Heartbeats();
    core_->Tick();
    now_ms_ += kLeaseMs / 2 + 200;
    Heartbeats();
    core_->Tick();
  }

  TempDir dir_;
  std::unique_ptr<CheckpointStore> store_;
};

TEST_F(EvalRecoveryTest, AWorkerLostWhileEvaluatingIsReplacedFromTheFinal) {
  StartWithCatalog();
  const v1::Job job = AlmostDone(4, kEvery);
  const v1::Plan before = PlanOf(job.id());
  ASSERT_THAT(CheckpointSteps(job.id()), ElementsAre(kEvery));
  // Stage 1's worker dies during the evaluation: its call fails at once,
  // its lease runs out later.
  control_.FailNext(Method::kEvaluate, before.stages(1).worker_address(),
                    absl::UnavailableError("connection reset by peer"));
  Train(1);

  // The final checkpoint was committed before the evaluation; the job
  // neither completes nor fails, and is not evaluated again while it waits.
  EXPECT_THAT(CheckpointSteps(job.id()), ElementsAre(kEvery, kSteps));
  const v1::Job waiting = Job(job.id());
  ASSERT_EQ(waiting.state(), v1::JOB_STATE_RUNNING) << waiting.error();
  EXPECT_EQ(waiting.restarts(), 0);
  EXPECT_EQ(waiting.evaluations_size(), 0);
  Heartbeats();
  core_->Tick();
  EXPECT_EQ(control_.CallsOf(Method::kEvaluate).size(), 3u);
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_RUNNING);

  const size_t configured = control_.CallsOf(Method::kConfigure).size();
  const size_t fetched = control_.CallsOf(Method::kFetchSnapshot).size();
  const std::string lost = KillStage(job.id(), 1);
  const v1::Job recovered = Job(job.id());
  ASSERT_EQ(recovered.state(), v1::JOB_STATE_RUNNING) << recovered.error();
  EXPECT_EQ(recovered.restarts(), 1);
  // A spare took stage 1, same partition; every stage was restored from
  // the final checkpoint: nothing is trained again.
  const v1::Plan after = PlanOf(job.id());
  ASSERT_EQ(after.stages_size(), 3);
  EXPECT_NE(after.stages(1).worker_id(), lost);
  const auto again = ConfiguresSince(configured);
  ASSERT_EQ(again.size(), 3u);
  for (const auto& c : again) {
    EXPECT_EQ(c.config.start_step(), kSteps);
    EXPECT_TRUE(c.config.restore_expected());
    EXPECT_EQ(control_.StageAt(c.address).restored_tensors,
              c.config.layer_end() - c.config.layer_begin());
  }
  ASSERT_EQ(recovered.rollbacks_size(), 1);
  EXPECT_EQ(recovered.rollbacks(0).from_step(), kSteps);
  EXPECT_EQ(recovered.rollbacks(0).to_step(), kSteps);
  EXPECT_EQ(recovered.rollbacks(0).version(), kSteps);

  Heartbeats();
  core_->Tick();
  const v1::Job done = Job(job.id());
  ASSERT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.error();
  EXPECT_EQ(done.step(), kSteps);
  EXPECT_DOUBLE_EQ(done.eval().accuracy(), 0.625);
  EXPECT_EQ(done.eval().step(), kSteps);
  EXPECT_EQ(done.evaluations_size(), 1);
  // Evaluated again on the new plan's workers; no new checkpoint.
  const auto evals = control_.CallsOf(Method::kEvaluate);
  ASSERT_EQ(evals.size(), 6u);
  std::set<std::string> planned;
  for (const auto& s : after.stages()) planned.insert(s.worker_address());
  const std::vector<FakeStageControl::Call> second(evals.begin() + 3,
                                                   evals.end());
  EXPECT_EQ(AddressSet(second), planned);
  EXPECT_EQ(control_.CallsOf(Method::kFetchSnapshot).size(), fetched);
  EXPECT_THAT(CheckpointSteps(job.id()), ElementsAre(kEvery, kSteps));
  for (const auto& [id, state] : WorkerStates()) {
    EXPECT_NE(state, v1::WORKER_STATE_ASSIGNED) << id;
  }

  EXPECT_THAT(EventKinds(done),
              ElementsAre(v1::JOB_EVENT_SUBMITTED, v1::JOB_EVENT_PLANNED,
                          v1::JOB_EVENT_STARTED, v1::JOB_EVENT_CHECKPOINT,
                          v1::JOB_EVENT_CHECKPOINT, v1::JOB_EVENT_WORKER_LOST,
                          v1::JOB_EVENT_RECOVERED, v1::JOB_EVENT_COMPLETED));
  EXPECT_EQ(done.events(5).message(),
            absl::StrCat("worker ", lost,
                         " of stage 1 was lost during the end-of-job "
                         "evaluation"));
  EXPECT_EQ(done.events(6).message(),
            absl::StrCat("restored at step ", kSteps, " from version ", kSteps,
                         "; nothing left to train, evaluating again"));
  EXPECT_EQ(done.events(6).step(), kSteps);
  const std::string metrics = metrics_.RenderText();
  EXPECT_THAT(metrics, HasSubstr("pipetrain_scheduler_recoveries_total 1"));
  EXPECT_THAT(metrics,
              HasSubstr("pipetrain_scheduler_recovery_seconds_count 1"));
}

TEST_F(EvalRecoveryTest, WithoutASpareTheJobIsReplannedAndEvaluatedAgain) {
  StartWithCatalog();
  const v1::Job job = AlmostDone(3, kEvery);
  control_.FailNext(Method::kEvaluate,
                    PlanOf(job.id()).stages(2).worker_address(),
                    absl::UnavailableError("connection reset by peer"));
  Train(1);
  ASSERT_EQ(Job(job.id()).state(), v1::JOB_STATE_RUNNING);
  KillStage(job.id(), 2);
  const v1::Plan after = PlanOf(job.id());
  ASSERT_EQ(after.stages_size(), 2);
  // Every layer restored under the new cut, at the last step.
  for (const auto& s : after.stages()) {
    const FakeStageControl::Stage stage = control_.StageAt(s.worker_address());
    EXPECT_EQ(stage.restored_tensors, s.layer_end() - s.layer_begin());
    EXPECT_EQ(stage.next_step, kSteps);
  }
  Heartbeats();
  core_->Tick();
  const v1::Job done = Job(job.id());
  ASSERT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.error();
  EXPECT_EQ(done.restarts(), 1);
  EXPECT_EQ(done.evaluations_size(), 1);
  EXPECT_THAT(EventKinds(done),
              ElementsAre(v1::JOB_EVENT_SUBMITTED, v1::JOB_EVENT_PLANNED,
                          v1::JOB_EVENT_STARTED, v1::JOB_EVENT_CHECKPOINT,
                          v1::JOB_EVENT_CHECKPOINT, v1::JOB_EVENT_WORKER_LOST,
                          v1::JOB_EVENT_REPLANNED, v1::JOB_EVENT_RECOVERED,
                          v1::JOB_EVENT_COMPLETED));
  EXPECT_THAT(done.events(6).message(), HasSubstr("from 3 to 2 stages"));
}

TEST_F(EvalRecoveryTest, WithoutTheFinalCheckpointThePeriodicOneIsTrainedOn) {
  StartWithCatalog();
  const v1::Job job = AlmostDone(3, kEvery);
  const v1::Plan plan = PlanOf(job.id());
  // The final checkpoint is not committed (a fetch fails), and stage 1's
  // evaluation fails by itself: no worker is lost.
  control_.FailNext(Method::kFetchSnapshot, plan.stages(2).worker_address(),
                    absl::UnavailableError("stream broke"));
  control_.FailNext(Method::kEvaluate, plan.stages(1).worker_address(),
                    absl::InternalError("out of memory"));
  Train(1);
  ASSERT_THAT(CheckpointSteps(job.id()), ElementsAre(kEvery));
  ASSERT_EQ(Job(job.id()).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(job.id()).restarts(), 0);

  // A lease later the evaluation's own error is the reason; the job
  // resumes on the same workers from the periodic checkpoint.
  const size_t configured = control_.CallsOf(Method::kConfigure).size();
  PassTheGrace();
  const v1::Job recovering = Job(job.id());
  ASSERT_EQ(recovering.state(), v1::JOB_STATE_RUNNING) << recovering.error();
  EXPECT_EQ(recovering.restarts(), 1);
  const v1::JobEvent& lost = *(recovering.events().rbegin());
  EXPECT_EQ(lost.kind(), v1::JOB_EVENT_WORKER_LOST);
  EXPECT_THAT(lost.message(), HasSubstr("the end-of-job evaluation failed"));
  EXPECT_THAT(lost.message(), HasSubstr("stage 1"));
  EXPECT_THAT(lost.message(), HasSubstr("out of memory"));
  const auto again = ConfiguresSince(configured);
  ASSERT_EQ(again.size(), 3u);
  for (const auto& c : again) EXPECT_EQ(c.config.start_step(), kEvery);
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(PlanOf(job.id()).stages(s).worker_id(),
              plan.stages(s).worker_id());
  }
  ASSERT_EQ(recovering.rollbacks_size(), 1);
  EXPECT_EQ(recovering.rollbacks(0).to_step(), kEvery);

  Train(1);
  EXPECT_EQ(Job(job.id()).events().rbegin()->kind(), v1::JOB_EVENT_RECOVERED);
  Train(kSteps - kEvery - 1);
  const v1::Job done = Job(job.id());
  ASSERT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.error();
  EXPECT_EQ(done.evaluations_size(), 1);
  // Its final checkpoint was taken this time.
  EXPECT_THAT(CheckpointSteps(job.id()), ElementsAre(kEvery, kSteps));
}

// Checkpoints are on but none was committed (a scheduler away while the job
// ran to its end fetched none, and the final one failed): the job is trained
// again from its start instead of failing, and completes.
TEST_F(EvalRecoveryTest, WithNoCheckpointCommittedYetEveryStepIsTrainedAgain) {
  StartWithCatalog();
  const v1::Job job = AlmostDone(3, /*every=*/100);
  const v1::Plan plan = PlanOf(job.id());
  control_.FailNext(Method::kFetchSnapshot, plan.stages(0).worker_address(),
                    absl::UnavailableError("stream broke"));
  control_.FailNext(Method::kEvaluate, plan.stages(1).worker_address(),
                    absl::InternalError("out of memory"));
  Train(1);
  ASSERT_TRUE(CheckpointSteps(job.id()).empty());
  ASSERT_EQ(Job(job.id()).state(), v1::JOB_STATE_RUNNING)
      << Job(job.id()).error();

  const size_t configured = control_.CallsOf(Method::kConfigure).size();
  PassTheGrace();
  const v1::Job recovering = Job(job.id());
  ASSERT_EQ(recovering.state(), v1::JOB_STATE_RUNNING) << recovering.error();
  EXPECT_EQ(recovering.restarts(), 1);
  const auto again = ConfiguresSince(configured);
  ASSERT_EQ(again.size(), 3u);
  for (const auto& c : again) {
    EXPECT_EQ(c.config.start_step(), 0);
    EXPECT_FALSE(c.config.restore_expected());
  }
  ASSERT_EQ(recovering.rollbacks_size(), 1);
  EXPECT_EQ(recovering.rollbacks(0).from_step(), kSteps);
  EXPECT_EQ(recovering.rollbacks(0).to_step(), 0);

  Train(kSteps);
  const v1::Job done = Job(job.id());
  ASSERT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.error();
  EXPECT_EQ(done.step(), kSteps);
  EXPECT_EQ(done.evaluations_size(), 1);
  EXPECT_THAT(CheckpointSteps(job.id()), ElementsAre(kSteps));
}

TEST_F(EvalRecoveryTest, WithCheckpointsOffTheJobFailsSayingWhy) {
  StartWithCatalog();
  const v1::Job job = AlmostDone(4, /*every=*/-1);
  control_.FailNext(Method::kEvaluate,
                    PlanOf(job.id()).stages(1).worker_address(),
                    absl::UnavailableError("connection reset by peer"));
  Train(1);
  const v1::Job failed = Job(job.id());
  ASSERT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.error(), HasSubstr("the end-of-job evaluation failed"));
  EXPECT_THAT(failed.error(), HasSubstr("connection reset by peer"));
  EXPECT_THAT(failed.error(),
              HasSubstr("it cannot be recovered: the job has no checkpoint "
                        "(checkpoints are off: checkpointEvery is -1)"));
  EXPECT_EQ(failed.restarts(), 0);
  EXPECT_TRUE(CheckpointSteps(job.id()).empty());
  EXPECT_TRUE(AllIdle());
}

TEST_F(EvalRecoveryTest, AnEvaluationFailingEveryTimeSpendsTheRestarts) {
  StartWithCatalog();
  const v1::Job job = AlmostDone(3, kEvery, /*max_restarts=*/1);
  const std::string stage1 = PlanOf(job.id()).stages(1).worker_address();
  control_.FailNext(Method::kEvaluate, stage1,
                    absl::InternalError("out of memory"));
  Train(1);
  PassTheGrace();
  ASSERT_EQ(Job(job.id()).restarts(), 1);
  control_.FailNext(Method::kEvaluate, stage1,
                    absl::InternalError("out of memory"));
  Heartbeats();
  core_->Tick();  // done at once: evaluated again, and failed again
  ASSERT_EQ(Job(job.id()).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(control_.CallsOf(Method::kEvaluate).size(), 6u);
  PassTheGrace();
  const v1::Job failed = Job(job.id());
  ASSERT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.error(), HasSubstr("the end-of-job evaluation failed"));
  EXPECT_THAT(failed.error(), HasSubstr("(gave up after 1 restarts)"));
  EXPECT_TRUE(AllIdle());
}

}  // namespace
}  // namespace testing_core
}  // namespace pipetrain
