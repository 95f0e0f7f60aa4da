// SchedulerCore on a persistent data directory: what reaches the disk and
// when, and restarts of the scheduler process.
#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler_core.h"
#include "scheduler/scheduler_core_test_fixture.h"
#include "scheduler/state_store.h"

namespace pipetrain {
namespace testing_core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Heartbeats only queue their writes; the control loop writes them. A
// submission is on disk before it is acknowledged. (A reader on a second
// connection sees the database as a restarted scheduler would.)
TEST_F(SchedulerCoreTest, HeartbeatsQueueTheirWritesSubmissionsAreDurable) {
  TempDir dir;
  core_ = MakeCore(&control_, dir.path());
  AddWorkers(3);
  auto reader = StateStore::Open(dir.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  const v1::Job job = Submit(Spec(3, 8));
  ASSERT_EQ((*reader)->LoadJobs()->size(), 1u);
  EXPECT_EQ((*reader)->LoadJobs()->at(0).id(), job.id());
  core_->Tick();  // starts it
  control_.Advance(2);
  Heartbeats();
  EXPECT_TRUE((*reader)->LoadVersions(job.id(), 0)->empty());
  EXPECT_EQ((*reader)->LoadJobs()->at(0).step(), 0);
  core_->Tick();
  EXPECT_EQ((*reader)->LoadVersions(job.id(), 0)->size(), 3u * 2);
  EXPECT_EQ((*reader)->LoadJobs()->at(0).step(), 2);
}

// A heartbeat's results are acknowledged before they are written; the
// response says which record they wait on and how far the disk is, so the
// worker reports them again until they are written (ReportCursor).
TEST_F(SchedulerCoreTest, AHeartbeatSaysWhenItsResultsAreOnDisk) {
  TempDir dir;
  core_ = MakeCore(&control_, dir.path());
  const v1::Job job = RunningJob(8);
  const v1::PlannedStage first = PlanOf(job.id()).stages(0);
  control_.Advance(2);
  v1::HeartbeatRequest h;
  h.set_worker_id(first.worker_id());
  *h.mutable_report() = *control_.Report(workers_[first.worker_id()]);
  ASSERT_EQ(h.report().status().results_size(), 2);
  auto acked = core_->Heartbeat(h);
  ASSERT_TRUE(acked.ok()) << acked.status();
  EXPECT_GT(acked->report_sequence(), acked->durable_sequence());
  // Repeated before the flush: it waits on the same writes, or later ones.
  auto repeated = core_->Heartbeat(h);
  ASSERT_TRUE(repeated.ok());
  EXPECT_GE(repeated->report_sequence(), acked->report_sequence());
  core_->Tick();  // writes
  auto reader = StateStore::Open(dir.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->LoadVersions(job.id(), 0)->size(), 2u);
  h.mutable_report()->mutable_status()->clear_results();
  auto after = core_->Heartbeat(h);
  ASSERT_TRUE(after.ok());
  EXPECT_GE(after->durable_sequence(), repeated->report_sequence());
  // A report the scheduler ignores (another worker's stage) waits on
  // nothing.
  h.set_worker_id(PlanOf(job.id()).stages(1).worker_id());
  auto ignored = core_->Heartbeat(h);
  ASSERT_TRUE(ignored.ok());
  EXPECT_EQ(ignored->report_sequence(), 0u);
}

// A scheduler that stops while it launches a job leaves the job PLANNING
// and its planned workers ASSIGNED on disk. The next scheduler stops those
// stages, frees the workers, and starts the job again.
TEST_F(SchedulerCoreTest, ARestartDuringLaunchResetsTheJobAndStartsItAgain) {
  TempDir dir;
  core_ = MakeCore(&control_, dir.path(), /*action_threads=*/true);
  AddWorkers(3);
  control_.HoldNext(Method::kTrain, "");
  const v1::Job job = Submit(Spec(3, 4));
  core_->Tick();
  ASSERT_TRUE(control_.WaitUntilHeld(std::chrono::seconds(10)));
  const std::vector<std::string> first_plan = PlannedAddresses(job.id());

  // The second scheduler process starts from what the first one wrote.
  FakeStageControl second_control;
  second_control.SetEvalResult(v1::EvalResult());
  std::unique_ptr<SchedulerCore> second = MakeCore(&second_control, dir.path());
  ASSERT_NE(second, nullptr);
  // The first one never finishes its launch: end it without a trace.
  control_.Release(absl::UnavailableError("scheduler killed"));
  core_.reset();

  EXPECT_EQ(Job(job.id(), second.get()).state(), v1::JOB_STATE_PLANNING);
  for (const auto& [id, state] : WorkerStates(second.get())) {
    EXPECT_EQ(state, v1::WORKER_STATE_ASSIGNED) << id;
  }
  Heartbeats(second.get());
  second->Tick();  // reset
  EXPECT_EQ(Job(job.id(), second.get()).state(), v1::JOB_STATE_PENDING);
  const auto stops = second_control.CallsOf(Method::kStop);
  EXPECT_EQ(AddressSet(stops),
            std::set<std::string>(first_plan.begin(), first_plan.end()));
  EXPECT_TRUE(AllIdle(second.get()));

  second->Tick();  // started again
  EXPECT_EQ(Job(job.id(), second.get()).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(second_control.CallsOf(Method::kTrain).size(), 3u);
  second.reset();
  // And that is what a third process finds.
  std::unique_ptr<SchedulerCore> third = MakeCore(&second_control, dir.path());
  EXPECT_EQ(Job(job.id(), third.get()).state(), v1::JOB_STATE_RUNNING);
  for (const auto& [id, state] : WorkerStates(third.get())) {
    EXPECT_EQ(state, v1::WORKER_STATE_ASSIGNED) << id;
  }
}

TEST_F(SchedulerCoreTest, JobsAndLedgerSurviveARestart) {
  TempDir dir;
  core_ = MakeCore(&control_, dir.path());
  const v1::Job job = RunningJob(4);
  Train(4);
  ASSERT_EQ(Job(job.id()).state(), v1::JOB_STATE_COMPLETED);
  core_.reset();
  core_ = MakeCore(&control_, dir.path());
  const v1::Job loaded = Job(job.id());
  EXPECT_EQ(loaded.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(loaded.evaluations_size(), 1);
  v1::GetVersionsRequest versions;
  versions.set_job_id(job.id());
  auto history = core_->GetVersions(versions);
  ASSERT_TRUE(history.ok()) << history.status();
  EXPECT_EQ(history->history_size(), 3 * 4);
  EXPECT_TRUE(AllIdle());
  // New ids continue after the loaded ones.
  EXPECT_EQ(Submit(Spec(1, 1)).id(), "job-2");
}

}  // namespace
}  // namespace testing_core
}  // namespace pipetrain
