// SchedulerCore across its own restarts and around recoveries: a restarted
// scheduler re-attaches to stages that trained on while it was away, or
// recovers the job from its last checkpoint when they are gone; a paused job
// whose worker is lost is recovered and stays paused; a report sent by a
// stage before a recovery and received after it moves nothing.
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

using ::testing::HasSubstr;

class ReattachTest : public SchedulerCoreTest {
 protected:
  // A core on dir_ with a checkpoint store, and a running 3-stage job of
  // `steps` steps that checkpoints every `every`.
  v1::Job StartJob(int workers, int64_t steps, int64_t every) {
    auto store = CheckpointStore::Open(dir_.path() + "/checkpoints");
    EXPECT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    checkpoints_ = store_.get();
    core_ = MakeCore(&control_, dir_.path());
    AddWorkers(workers);
    v1::JobSpec spec = Spec(3, steps);
    spec.mutable_training()->set_checkpoint_every(every);
    const v1::Job job = Submit(spec);
    core_->Tick();
    EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_RUNNING);
    return Job(job.id());
  }

  // The scheduler process dies and a new one starts on the same data
  // directory; the stages train `steps` meanwhile.
  void RestartScheduler(int64_t steps_while_away) {
    core_.reset();
    control_.Advance(steps_while_away);
    core_ = MakeCore(&control_, dir_.path());
    ASSERT_NE(core_, nullptr);
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

  v1::GetVersionsResponse Versions(const std::string& job_id) {
    v1::GetVersionsRequest r;
    r.set_job_id(job_id);
    auto versions = core_->GetVersions(r);
    EXPECT_TRUE(versions.ok()) << versions.status();
    return versions.ok() ? *versions : v1::GetVersionsResponse();
  }

  TempDir dir_;
  std::unique_ptr<CheckpointStore> store_;
};

TEST_F(ReattachTest,
       ARestartedSchedulerFollowsTheStagesAndGoesOnCheckpointing) {
  const v1::Job job = StartJob(3, 20, 4);
  Train(5);  // checkpoint at step 4
  EXPECT_EQ(CheckpointSteps(job.id()), std::vector<int64_t>({4}));
  const size_t configured = control_.CallsOf(Method::kConfigure).size();
  const size_t stopped = control_.CallsOf(Method::kStop).size();
  RestartScheduler(/*steps_while_away=*/5);
  Heartbeats();
  core_->Tick();
  const v1::Job attached = Job(job.id());
  EXPECT_EQ(attached.state(), v1::JOB_STATE_RUNNING) << attached.error();
  EXPECT_EQ(attached.step(), 10);
  EXPECT_EQ(attached.restarts(), 0);
  // Past the re-attach deadline nothing changes either.
  now_ms_ += 3 * kLeaseMs;
  Train(1);
  EXPECT_EQ(Job(job.id()).restarts(), 0);
  EXPECT_EQ(control_.CallsOf(Method::kConfigure).size(), configured);
  EXPECT_EQ(control_.CallsOf(Method::kStop).size(), stopped);
  // Boundary 8 passed while it was away; it is fetched, then 12 and 16.
  EXPECT_THAT(CheckpointSteps(job.id()), ::testing::ElementsAre(4, 8));
  Train(3);
  Train(3);
  Train(3);
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_COMPLETED);
  // ... and the final step's checkpoint at the end (three kept).
  EXPECT_THAT(CheckpointSteps(job.id()), ::testing::ElementsAre(12, 16, 20));
  // Every (stage, step) in the ledger, once, including the steps trained
  // while the scheduler was away (the workers report them when it is back).
  std::set<std::pair<int, int64_t>> seen;
  const v1::GetVersionsResponse versions = Versions(job.id());
  for (const auto& v : versions.history()) {
    EXPECT_TRUE(seen.insert({v.stage(), v.step()}).second);
  }
  EXPECT_EQ(seen.size(), 3u * 20u);
}

TEST_F(ReattachTest, StagesGoneAfterARestartAreRecoveredFromTheCheckpoint) {
  const v1::Job job = StartJob(3, 20, 4);
  Train(6);
  ASSERT_EQ(CheckpointSteps(job.id()), std::vector<int64_t>({4}));
  const std::vector<std::string> addresses = PlannedAddresses(job.id());
  core_.reset();
  // The workers live on, but their stages are gone (a worker that restarted
  // under the same id, or stages a dying scheduler had stopped).
  for (const std::string& a : addresses) {
    ASSERT_TRUE(control_.Stop(a, job.id()).ok());
  }
  core_ = MakeCore(&control_, dir_.path());
  Heartbeats();
  core_->Tick();
  EXPECT_EQ(Job(job.id()).restarts(), 0);  // waits for their reports
  now_ms_ += 3 * kLeaseMs;
  Heartbeats();
  core_->Tick();
  const v1::Job recovered = Job(job.id());
  ASSERT_EQ(recovered.state(), v1::JOB_STATE_RUNNING) << recovered.error();
  EXPECT_EQ(recovered.restarts(), 1);
  ASSERT_EQ(recovered.rollbacks_size(), 1);
  EXPECT_EQ(recovered.rollbacks(0).to_step(), 4);
  bool lost = false;
  for (const v1::JobEvent& e : recovered.events()) {
    if (e.kind() != v1::JOB_EVENT_WORKER_LOST) continue;
    lost = true;
    EXPECT_THAT(e.message(), HasSubstr("could not re-attach"));
  }
  EXPECT_TRUE(lost);
  for (const auto& c : control_.CallsOf(Method::kConfigure)) {
    if (c.config.attempt() == 1) {
      EXPECT_EQ(c.config.start_step(), 4);
    }
  }
  Train(16);
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_COMPLETED);
}

TEST_F(ReattachTest, APausedJobIsRecoveredFromItsCheckpointAndStaysPaused) {
  const v1::Job job = StartJob(4, 20, 4);
  Train(6);
  ASSERT_TRUE(core_->PauseJob(Action(job.id())).ok());
  Train(2);
  ASSERT_EQ(Job(job.id()).state(), v1::JOB_STATE_PAUSED);
  const size_t trained = control_.CallsOf(Method::kTrain).size();
  KillStage(job.id(), 1);
  const v1::Job recovered = Job(job.id());
  ASSERT_EQ(recovered.state(), v1::JOB_STATE_PAUSED) << recovered.error();
  EXPECT_EQ(recovered.restarts(), 1);
  EXPECT_EQ(recovered.step(), 4);
  // Restored from the checkpoint, not training.
  EXPECT_EQ(control_.CallsOf(Method::kTrain).size(), trained);
  for (const std::string& a : PlannedAddresses(job.id())) {
    const FakeStageControl::Stage s = control_.StageAt(a);
    EXPECT_EQ(s.state, v1::STAGE_STATE_CONFIGURED) << a;
    EXPECT_FALSE(s.awaiting_restore) << a;
    EXPECT_EQ(s.next_step, 4) << a;
  }
  ASSERT_GE(recovered.events_size(), 1);
  const v1::JobEvent& last = *recovered.events().rbegin();
  EXPECT_EQ(last.kind(), v1::JOB_EVENT_RECOVERED);
  EXPECT_THAT(last.message(), HasSubstr("still paused"));
  // It stays paused until resumed, then trains to the end.
  Train(3);
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_PAUSED);
  ASSERT_TRUE(core_->ResumeJob(Action(job.id())).ok());
  Train(16);
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_COMPLETED);
}

TEST_F(ReattachTest, AReportFromBeforeARecoveryMovesNothing) {
  const v1::Job job = StartJob(4, 20, 4);
  Train(6);
  const v1::PlannedStage last = PlanOf(job.id()).stages(2);
  KillStage(job.id(), 1);
  ASSERT_EQ(Job(job.id()).restarts(), 1);
  const int events = Job(job.id()).events_size();
  // The last stage's report of steps 6 and 7, built before the stop and
  // received after the recovery (the old configuration: attempt 0), once
  // running and once failed.
  for (v1::StageState state :
       {v1::STAGE_STATE_RUNNING, v1::STAGE_STATE_FAILED}) {
    v1::HeartbeatRequest h;
    h.set_worker_id(last.worker_id());
    v1::StageReport* report = h.mutable_report();
    report->set_job_id(job.id());
    report->set_stage(2);
    report->set_attempt(0);
    report->mutable_status()->set_state(state);
    report->mutable_status()->set_error("the upstream went away");
    report->mutable_status()->set_next_step(8);
    report->mutable_status()->set_weight_version(8);
    for (int64_t step : {6, 7}) {
      v1::StepResult* r = report->mutable_status()->add_results();
      r->set_step(step);
      r->set_weight_version(step + 1);
    }
    ASSERT_TRUE(core_->Heartbeat(h).ok());
    core_->Tick();
  }
  const v1::Job after = Job(job.id());
  EXPECT_EQ(after.restarts(), 1);
  EXPECT_EQ(after.step(), 4);
  EXPECT_EQ(after.committed_version(), 4);
  EXPECT_EQ(after.events_size(), events);  // no RECOVERED from old steps
  const v1::GetVersionsResponse stale = Versions(job.id());
  for (const auto& v : stale.history()) {
    EXPECT_LT(v.step(), 6) << "stage " << v.stage();
  }
  Train(16);
  const v1::Job done = Job(job.id());
  EXPECT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.error();
  EXPECT_EQ(done.restarts(), 1);
  std::set<std::pair<int, int64_t>> seen;
  const v1::GetVersionsResponse versions = Versions(job.id());
  for (const auto& v : versions.history()) {
    EXPECT_TRUE(seen.insert({v.stage(), v.step()}).second);
  }
  EXPECT_EQ(seen.size(), 3u * 20u);
}

}  // namespace
}  // namespace testing_core
}  // namespace pipetrain
