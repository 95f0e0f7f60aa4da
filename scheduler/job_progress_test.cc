#include "scheduler/job_progress.h"

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// A RUNNING 2-stage job, stage s on worker "w-s".
JobRecord TwoStageJob() {
  JobRecord r;
  r.job.set_id("job-1");
  r.job.set_state(v1::JOB_STATE_RUNNING);
  r.job.set_total_steps(4);
  r.job.mutable_spec()->mutable_training()->set_batch_size(100);
  v1::Plan plan;
  for (int s = 0; s < 2; ++s) {
    v1::PlannedStage* p = plan.add_stages();
    p->set_stage(s);
    p->set_worker_id("w-" + std::to_string(s));
  }
  r.plan = plan;
  r.reports.resize(2);
  return r;
}

v1::StageReport Report(int stage, int64_t next_step, std::vector<int64_t> steps,
                       v1::StageState state = v1::STAGE_STATE_RUNNING) {
  v1::StageReport r;
  r.set_job_id("job-1");
  r.set_stage(stage);
  r.mutable_status()->set_state(state);
  r.mutable_status()->set_next_step(next_step);
  r.mutable_status()->set_weight_version(next_step);
  r.mutable_status()->set_idle_fraction(0.25);
  for (int64_t step : steps) {
    v1::StepResult* s = r.mutable_status()->add_results();
    s->set_step(step);
    s->set_loss(10.0 + step);
    s->set_accuracy(0.1 * step);
    s->set_seconds(0.5);
    s->set_weight_version(step + 1);
    s->set_epoch(step / 2);
  }
  return r;
}

// Workers repeat their results until the scheduler has written them down
// (services/worker/report_cursor.h): a repeated result is taken once.
TEST(ApplyStageReportTest, RepeatedResultsAreTakenOnce) {
  JobRecord r = TwoStageJob();
  ReportEffects e = ApplyStageReport("w-1", Report(1, 2, {0, 1}), 5, &r);
  ASSERT_EQ(e.ledger.size(), 2u);
  e = ApplyStageReport("w-1", Report(1, 4, {0, 1, 2, 3}), 6, &r);
  ASSERT_TRUE(e.applied);
  ASSERT_EQ(e.ledger.size(), 2u);
  EXPECT_EQ(e.ledger[0].step(), 2);
  EXPECT_EQ(e.ledger[1].step(), 3);
  EXPECT_EQ(r.recent_step_seconds.size(), 4u);
  EXPECT_EQ(r.job.step(), 0);  // stage 0 has not reported
  e = ApplyStageReport("w-1", Report(1, 4, {2, 3}), 7, &r);
  EXPECT_TRUE(e.applied);
  EXPECT_TRUE(e.ledger.empty());
  EXPECT_EQ(r.recent_step_seconds.size(), 4u);
  // Stage 0 is counted on its own.
  e = ApplyStageReport("w-0", Report(0, 2, {0, 1}), 8, &r);
  EXPECT_EQ(e.ledger.size(), 2u);
  // A new configuration (after a recovery) runs its steps again.
  r.job.set_attempt(1);
  v1::StageReport resumed = Report(1, 4, {2, 3});
  resumed.set_attempt(1);
  e = ApplyStageReport("w-1", resumed, 9, &r);
  EXPECT_EQ(e.ledger.size(), 2u);
}

v1::EvalResult EvalAt(int64_t step, double loss) {
  v1::EvalResult e;
  e.set_step(step);
  e.set_loss(loss);
  e.set_samples(10);
  return e;
}

TEST(ApplyStageReportTest, ProgressComesFromTheRightStages) {
  JobRecord r = TwoStageJob();
  ReportEffects e = ApplyStageReport("w-0", Report(0, 3, {0, 1, 2}), 5, &r);
  ASSERT_TRUE(e.applied);
  ASSERT_EQ(e.ledger.size(), 3u);
  EXPECT_EQ(e.ledger[2].stage(), 0);
  EXPECT_EQ(e.ledger[2].step(), 2);
  EXPECT_EQ(e.ledger[2].weight_version(), 3);
  EXPECT_EQ(e.ledger[2].unix_ms(), 5);
  EXPECT_EQ(r.job.epoch(), 1);  // stage 0's
  EXPECT_EQ(r.job.loss(), 0);   // not from stage 0
  EXPECT_EQ(r.job.step(), 0);   // stage 1 has not reported
  e = ApplyStageReport("w-1", Report(1, 2, {0, 1}), 6, &r);
  ASSERT_TRUE(e.applied);
  EXPECT_EQ(r.job.step(), 2);  // the slowest stage's
  EXPECT_EQ(r.job.committed_version(), 2);
  EXPECT_DOUBLE_EQ(r.job.loss(), 11.0);  // the last stage's latest step
  EXPECT_DOUBLE_EQ(r.job.samples_per_second(), 200.0);
  ASSERT_EQ(r.job.stages_size(), 2);
  EXPECT_EQ(r.job.stages(1).worker_id(), "w-1");
  EXPECT_DOUBLE_EQ(r.job.stages(1).busy_fraction(), 0.75);
  EXPECT_EQ(r.job.updated_unix_ms(), 6);
  // Kept reports carry no step results.
  EXPECT_EQ(r.reports[1].status().results_size(), 0);
}

TEST(ApplyStageReportTest, ReportsThatDoNotBelongAreIgnored) {
  JobRecord r = TwoStageJob();
  EXPECT_FALSE(ApplyStageReport("w-1", Report(0, 3, {0}), 1, &r).applied);
  EXPECT_FALSE(ApplyStageReport("w-0", Report(2, 3, {0}), 1, &r).applied);
  v1::StageReport other = Report(0, 3, {0});
  other.set_job_id("job-2");
  EXPECT_FALSE(ApplyStageReport("w-0", other, 1, &r).applied);
  r.job.set_state(v1::JOB_STATE_CANCELLED);
  EXPECT_FALSE(ApplyStageReport("w-0", Report(0, 3, {0}), 1, &r).applied);
  JobRecord unplanned = TwoStageJob();
  unplanned.plan.reset();
  EXPECT_FALSE(
      ApplyStageReport("w-0", Report(0, 3, {0}), 1, &unplanned).applied);
  EXPECT_EQ(r.job.step(), 0);
}

TEST(ApplyStageReportTest, PeriodicEvaluationsComeOnceFromTheLastStage) {
  JobRecord r = TwoStageJob();
  v1::StageReport last = Report(1, 2, {});
  *last.mutable_status()->add_evaluations() = EvalAt(2, 0.5);
  EXPECT_EQ(ApplyStageReport("w-1", last, 1, &r).new_evaluations, 1);
  // The same report again (a retried heartbeat), then a newer one.
  EXPECT_EQ(ApplyStageReport("w-1", last, 2, &r).new_evaluations, 0);
  *last.mutable_status()->add_evaluations() = EvalAt(4, 0.25);
  EXPECT_EQ(ApplyStageReport("w-1", last, 3, &r).new_evaluations, 1);
  v1::StageReport first = Report(0, 2, {});
  *first.mutable_status()->add_evaluations() = EvalAt(6, 9.0);
  EXPECT_EQ(ApplyStageReport("w-0", first, 4, &r).new_evaluations, 0);
  ASSERT_EQ(r.job.evaluations_size(), 2);
  EXPECT_EQ(r.job.evaluations(1).step(), 4);
  EXPECT_EQ(r.job.eval().step(), 4);
  EXPECT_DOUBLE_EQ(r.job.eval().loss(), 0.25);
  EXPECT_EQ(r.reports[1].status().evaluations_size(), 0);
}

TEST(JobFailureTest, NamesTheLostWorkerTheRestartedOneOrTheFailedStage) {
  JobRecord r = TwoStageJob();
  std::map<std::string, v1::WorkerInfo> workers;
  for (int s = 0; s < 2; ++s) {
    v1::WorkerInfo& w = workers["w-" + std::to_string(s)];
    w.set_id("w-" + std::to_string(s));
    w.set_state(v1::WORKER_STATE_ASSIGNED);
    w.set_job_id("job-1");
  }
  EXPECT_EQ(JobFailure(workers, 0, 0, &r), std::nullopt);
  r.reports[1] = Report(1, 1, {}, v1::STAGE_STATE_FAILED);
  r.reports[1].mutable_status()->set_error("NaN loss");
  EXPECT_EQ(JobFailure(workers, 0, 0, &r), "stage 1 failed: NaN loss");
  workers["w-0"].clear_job_id();
  EXPECT_EQ(JobFailure(workers, 0, 0, &r),
            "worker w-0 of stage 0 no longer runs this job (it restarted)");
  workers["w-0"].set_state(v1::WORKER_STATE_LOST);
  EXPECT_EQ(JobFailure(workers, 0, 0, &r), "worker w-0 of stage 0 was lost");
  workers.erase("w-0");
  EXPECT_EQ(JobFailure(workers, 0, 0, &r), "worker w-0 of stage 0 was lost");
}

// A stage that lost its neighbour's stream fails first; the reason waits
// for the neighbour's lease so that it names the lost worker.
TEST(JobFailureTest, AnUnreachableNeighbourWaitsForTheLeaseToNameTheWorker) {
  JobRecord r = TwoStageJob();
  std::map<std::string, v1::WorkerInfo> workers;
  for (int s = 0; s < 2; ++s) {
    v1::WorkerInfo& w = workers["w-" + std::to_string(s)];
    w.set_id("w-" + std::to_string(s));
    w.set_state(v1::WORKER_STATE_ASSIGNED);
    w.set_job_id("job-1");
  }
  r.reports[0] = Report(0, 1, {}, v1::STAGE_STATE_FAILED);
  r.reports[0].mutable_status()->set_error("stream to the next stage ended");
  r.reports[0].mutable_status()->set_error_code(
      static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(JobFailure(workers, 1000, 3100, &r), std::nullopt);
  EXPECT_EQ(JobFailure(workers, 3000, 3100, &r), std::nullopt);
  workers["w-1"].set_state(v1::WORKER_STATE_LOST);
  EXPECT_EQ(JobFailure(workers, 3500, 3100, &r),
            "worker w-1 of stage 1 was lost");
  // Nobody lost within the grace: the stage's own error.
  workers["w-1"].set_state(v1::WORKER_STATE_ASSIGNED);
  EXPECT_EQ(JobFailure(workers, 4000, 3100, &r), std::nullopt);
  EXPECT_EQ(JobFailure(workers, 4100, 3100, &r),
            "stage 0 failed: stream to the next stage ended");
}

TEST(StagesDoneTest, EveryStageDoneAtTheLastStep) {
  JobRecord r = TwoStageJob();
  EXPECT_FALSE(StagesDone(r));
  r.reports[0] = Report(0, 4, {}, v1::STAGE_STATE_DONE);
  EXPECT_FALSE(StagesDone(r));
  r.reports[1] = Report(1, 3, {}, v1::STAGE_STATE_DONE);  // paused early
  EXPECT_FALSE(StagesDone(r));
  r.reports[1] = Report(1, 4, {}, v1::STAGE_STATE_DONE);
  EXPECT_TRUE(StagesDone(r));
  r.job.set_state(v1::JOB_STATE_PAUSED);
  EXPECT_FALSE(StagesDone(r));
}

}  // namespace
}  // namespace pipetrain
