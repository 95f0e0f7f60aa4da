// SchedulerCore's job lifecycle: launch, completion, the state machine
// under user actions, and the failures that end a job.
#include "scheduler/scheduler_core.h"

#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler_core_test_fixture.h"

namespace pipetrain {
namespace testing_core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST_F(SchedulerCoreTest, LaunchesLastStageFirstAndCompletesWithAnEvaluation) {
  Start();
  const v1::Job running = RunningJob(6);
  const std::vector<std::string> a = PlannedAddresses(running.id());
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(running.total_steps(), 6);
  // Each downstream listens before its upstream dials.
  const auto configures = control_.CallsOf(Method::kConfigure);
  EXPECT_THAT(AddressesOf(configures), ElementsAre(a[2], a[1], a[0]));
  EXPECT_EQ(configures[0].config.stage(), 2);
  EXPECT_EQ(configures[2].config.downstream(), a[1]);
  const auto trains = control_.CallsOf(Method::kTrain);
  EXPECT_THAT(AddressesOf(trains), ElementsAre(a[2], a[1], a[0]));
  EXPECT_EQ(trains[0].arg, 6);
  EXPECT_FALSE(AllIdle());

  Train(3);
  EXPECT_EQ(Job(running.id()).step(), 3);
  EXPECT_EQ(Job(running.id()).state(), v1::JOB_STATE_RUNNING);
  Train(3);
  const v1::Job done = Job(running.id());
  ASSERT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.error();
  EXPECT_EQ(done.step(), 6);
  EXPECT_DOUBLE_EQ(done.loss(), 1.0 / 6);  // the last step's, last stage
  // Evaluated through the pipeline: every stage called once, with the
  // spec's sample count; the last stage's answer is the job's.
  const auto evals = control_.CallsOf(Method::kEvaluate);
  EXPECT_EQ(AddressSet(evals), std::set<std::string>(a.begin(), a.end()));
  EXPECT_EQ(evals.size(), 3u);
  EXPECT_EQ(evals[0].arg, 1000);
  EXPECT_DOUBLE_EQ(done.eval().loss(), 0.75);
  EXPECT_DOUBLE_EQ(done.eval().accuracy(), 0.625);
  EXPECT_EQ(done.eval().step(), 6);
  ASSERT_EQ(done.evaluations_size(), 1);
  EXPECT_TRUE(AllIdle());
}

TEST_F(SchedulerCoreTest, AFailedEndOfJobEvaluationFailsTheJob) {
  Start();
  const v1::Job job = RunningJob(4);
  const std::vector<std::string> a = PlannedAddresses(job.id());
  control_.FailNext(Method::kEvaluate, a[1],
                    absl::InternalError("activation shape mismatch"));
  Train(4);
  const v1::Job failed = Job(job.id());
  ASSERT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.error(), HasSubstr("end-of-job evaluation failed"));
  EXPECT_THAT(failed.error(), HasSubstr("stage 1"));
  EXPECT_THAT(failed.error(), HasSubstr("activation shape mismatch"));
  // Nothing to evaluate again from (scheduler_core_eval_recovery_test.cc
  // recovers with checkpoints).
  EXPECT_THAT(failed.error(),
              HasSubstr("it cannot be recovered: this scheduler keeps no "
                        "checkpoints"));
  EXPECT_EQ(failed.restarts(), 0);
  EXPECT_EQ(failed.evaluations_size(), 0);
  EXPECT_EQ(control_.CallsOf(Method::kStop).size(), 3u);
  EXPECT_TRUE(AllIdle());
}

TEST_F(SchedulerCoreTest, PauseLetsStageZeroPickTheStepAndResumeRestoresIt) {
  Start();
  const v1::Job job = RunningJob(10);
  const std::vector<std::string> a = PlannedAddresses(job.id());
  Train(2);  // stages mid-run: step 2 in progress
  auto paused = core_->PauseJob(Action(job.id()));
  ASSERT_TRUE(paused.ok()) << paused.status();
  EXPECT_EQ(paused->state(), v1::JOB_STATE_PAUSED);
  auto trains = control_.CallsOf(Method::kTrain);
  ASSERT_EQ(trains.size(), 6u);
  // Stage 0 first with 0; the others get the step it answered (3).
  EXPECT_EQ(trains[3].address, a[0]);
  EXPECT_EQ(trains[3].arg, 0);
  EXPECT_EQ(trains[4].arg, 3);
  EXPECT_EQ(trains[5].arg, 3);
  Train(5);
  EXPECT_EQ(Job(job.id()).step(), 3);
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_PAUSED);

  auto resumed = core_->ResumeJob(Action(job.id()));
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->state(), v1::JOB_STATE_RUNNING);
  trains = control_.CallsOf(Method::kTrain);
  EXPECT_THAT(AddressesOf(std::vector<FakeStageControl::Call>(
                  trains.begin() + 6, trains.end())),
              ElementsAre(a[2], a[1], a[0]));
  EXPECT_EQ(trains.back().arg, 10);
  Train(7);
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_COMPLETED);
}

TEST_F(SchedulerCoreTest, UserActionsFromEveryStateFollowTheStateMachine) {
  Start();
  AddWorkers(3);
  // PENDING (no worker matches): only cancel applies.
  v1::JobSpec unplaceable = Spec(1, 5);
  (*unplaceable.mutable_worker_selector())["zone"] = "mars";
  const v1::Job pending = Submit(unplaceable);
  core_->Tick();
  EXPECT_EQ(Job(pending.id()).state(), v1::JOB_STATE_PENDING);
  EXPECT_TRUE(absl::IsFailedPrecondition(
      core_->PauseJob(Action(pending.id())).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(
      core_->ResumeJob(Action(pending.id())).status()));
  v1::EvaluateRequest eval;
  eval.set_job_id(pending.id());
  EXPECT_TRUE(absl::IsFailedPrecondition(core_->Evaluate(eval).status()));
  auto cancelled = core_->CancelJob(Action(pending.id()));
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_TRUE(control_.calls().empty());  // nothing ran anywhere

  // RUNNING: resume and evaluate are refused.
  const v1::Job job = RunningJob(8, /*add_workers=*/false);
  EXPECT_TRUE(
      absl::IsFailedPrecondition(core_->ResumeJob(Action(job.id())).status()));
  eval.set_job_id(job.id());
  EXPECT_TRUE(absl::IsFailedPrecondition(core_->Evaluate(eval).status()));
  // PAUSED: pause again is refused.
  ASSERT_TRUE(core_->PauseJob(Action(job.id())).ok());
  EXPECT_TRUE(
      absl::IsFailedPrecondition(core_->PauseJob(Action(job.id())).status()));
  // Cancelling a paused job stops every stage and frees the workers.
  const std::vector<std::string> a = PlannedAddresses(job.id());
  cancelled = core_->CancelJob(Action(job.id()));
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  const auto stops = control_.CallsOf(Method::kStop);
  EXPECT_EQ(AddressSet(stops), std::set<std::string>(a.begin(), a.end()));
  EXPECT_TRUE(control_.StageAt(a[0]).job_id.empty());
  EXPECT_TRUE(AllIdle());
  // Final states take no action.
  for (const std::string& id : {pending.id(), job.id()}) {
    EXPECT_TRUE(
        absl::IsFailedPrecondition(core_->PauseJob(Action(id)).status()));
    EXPECT_TRUE(
        absl::IsFailedPrecondition(core_->ResumeJob(Action(id)).status()));
    EXPECT_TRUE(
        absl::IsFailedPrecondition(core_->CancelJob(Action(id)).status()));
  }
  EXPECT_TRUE(absl::IsNotFound(core_->PauseJob(Action("job-99")).status()));
}

TEST_F(SchedulerCoreTest, ARunningJobCanBeCancelledAndACompletedOneNot) {
  Start();
  const v1::Job job = RunningJob(4);
  Train(1);
  auto cancelled = core_->CancelJob(Action(job.id()));
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(control_.CallsOf(Method::kStop).size(), 3u);
  EXPECT_TRUE(AllIdle());
  // Reports that stages sent before they stopped change nothing.
  Train(3);
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_CANCELLED);

  const v1::Job second = Submit(Spec(3, 2));
  core_->Tick();
  Train(2);
  ASSERT_EQ(Job(second.id()).state(), v1::JOB_STATE_COMPLETED);
  EXPECT_TRUE(absl::IsFailedPrecondition(
      core_->CancelJob(Action(second.id())).status()));
  // A completed job's stages still hold it: it can be evaluated again; a
  // cancelled one's cannot.
  v1::EvaluateRequest eval;
  eval.set_job_id(second.id());
  EXPECT_TRUE(core_->Evaluate(eval).ok());
  EXPECT_EQ(Job(second.id()).evaluations_size(), 2);
  eval.set_job_id(job.id());
  EXPECT_TRUE(absl::IsFailedPrecondition(core_->Evaluate(eval).status()));
}

TEST_F(SchedulerCoreTest, AJobBeingLaunchedCannotBeSteeredUntilItRuns) {
  Start(/*action_threads=*/true);
  AddWorkers(3);
  control_.HoldNext(Method::kConfigure, "");
  const v1::Job job = Submit(Spec(3, 4));
  core_->Tick();
  ASSERT_TRUE(control_.WaitUntilHeld(std::chrono::seconds(10)));
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_PLANNING);
  EXPECT_TRUE(absl::IsUnavailable(core_->CancelJob(Action(job.id())).status()));
  EXPECT_TRUE(
      absl::IsFailedPrecondition(core_->PauseJob(Action(job.id())).status()));
  control_.Release();
  core_->WaitForActions();
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(core_->CancelJob(Action(job.id())).ok());
}

TEST_F(SchedulerCoreTest, AWorkerLostWhilePlanningSendsTheJobBackToWait) {
  Start(/*action_threads=*/true);
  AddWorkers(3);
  control_.HoldNext(Method::kProfile, "");
  const v1::Job job = Submit(Spec(3, 4));
  core_->Tick();
  ASSERT_TRUE(control_.WaitUntilHeld(std::chrono::seconds(10)));
  // One of the three workers misses its lease while the job is profiled.
  const std::string lost = workers_.begin()->first;
  now_ms_ += kLeaseMs + 1;
  Heartbeats(nullptr, lost);
  core_->Tick();
  control_.Release();
  core_->WaitForActions();
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_PENDING);
  EXPECT_TRUE(control_.CallsOf(Method::kConfigure).empty());
  for (const auto& [id, state] : WorkerStates()) {
    EXPECT_EQ(state, id == lost ? v1::WORKER_STATE_LOST : v1::WORKER_STATE_IDLE)
        << id;
  }
  // It starts once three workers are back.
  Heartbeats();
  core_->Tick();
  core_->WaitForActions();
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_RUNNING);
}

TEST_F(SchedulerCoreTest, AFailedLaunchFailsTheJobAndFreesItsWorkers) {
  Start();
  AddWorkers(3);
  control_.FailNext(Method::kTrain, "", absl::UnavailableError("refused"));
  const v1::Job job = Submit(Spec(3, 4));
  core_->Tick();
  const v1::Job failed = Job(job.id());
  ASSERT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.error(), HasSubstr("could not start"));
  EXPECT_THAT(failed.error(), HasSubstr("stage 2"));
  EXPECT_THAT(failed.error(), HasSubstr("refused"));
  EXPECT_TRUE(AllIdle());
}

// Without restarts (maxRestarts -1) a loss ends the job; recovery is in
// scheduler_core_recovery_test.cc.
TEST_F(SchedulerCoreTest, AWorkerLostMidJobFailsItWithTheReason) {
  Start();
  AddWorkers(3);
  v1::JobSpec spec = Spec(3, 10);
  spec.mutable_training()->set_max_restarts(-1);
  const v1::Job job = Submit(spec);
  core_->Tick();
  Train(2);
  std::string lost_id;
  v1::GetPlanRequest plan_request;
  plan_request.set_job_id(job.id());
  lost_id = core_->GetPlan(plan_request)->stages(1).worker_id();
  now_ms_ += kLeaseMs + 1;
  Heartbeats(nullptr, lost_id);
  core_->Tick();
  const v1::Job failed = Job(job.id());
  ASSERT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed.error(),
            absl::StrCat("worker ", lost_id, " of stage 1 was lost"));
  const auto states = WorkerStates();
  for (const auto& [id, state] : states) {
    EXPECT_EQ(state,
              id == lost_id ? v1::WORKER_STATE_LOST : v1::WORKER_STATE_IDLE)
        << id;
  }
  EXPECT_EQ(control_.CallsOf(Method::kStop).size(), 3u);
}

TEST_F(SchedulerCoreTest, AStageReportingFailureFailsTheJob) {
  Start();
  AddWorkers(3);
  v1::JobSpec spec = Spec(3, 10);
  spec.mutable_training()->set_max_restarts(-1);
  const v1::Job job = Submit(spec);
  core_->Tick();
  control_.FailStage(PlannedAddresses(job.id())[2], "out of memory");
  Train(1);
  const v1::Job failed = Job(job.id());
  ASSERT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed.error(), "stage 2 failed: out of memory");
  EXPECT_TRUE(AllIdle());
  // A failed job takes no action.
  EXPECT_TRUE(
      absl::IsFailedPrecondition(core_->PauseJob(Action(job.id())).status()));
  EXPECT_TRUE(
      absl::IsFailedPrecondition(core_->ResumeJob(Action(job.id())).status()));
  EXPECT_TRUE(
      absl::IsFailedPrecondition(core_->CancelJob(Action(job.id())).status()));
  v1::EvaluateRequest eval;
  eval.set_job_id(job.id());
  EXPECT_TRUE(absl::IsFailedPrecondition(core_->Evaluate(eval).status()));
}

}  // namespace
}  // namespace testing_core
}  // namespace pipetrain
