#include "services/ctl/progress_bar.h"

#include <string>

#include "gtest/gtest.h"

namespace pipetrain {
namespace ctl {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

// Three stages, 60% through: the example of the header.
v1::Job RunningJob() {
  v1::Job job;
  job.set_id("job-3");
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_step(1125);
  job.set_total_steps(1875);
  job.set_epoch(1);
  job.set_loss(0.4123);
  job.set_accuracy(0.852);
  job.set_samples_per_second(1830);
  for (double busy : {0.81, 0.77, 0.90}) {
    job.add_stages()->set_busy_fraction(busy);
  }
  return job;
}

TEST(HumanizeBytes, UsesBinaryUnitsWithOneDecimalBelowTen) {
  EXPECT_EQ(HumanizeBytes(0), "0 B");
  EXPECT_EQ(HumanizeBytes(512), "512 B");
  EXPECT_EQ(HumanizeBytes(1023), "1023 B");
  EXPECT_EQ(HumanizeBytes(1536), "1.5 KiB");
  EXPECT_EQ(HumanizeBytes(10 * 1024), "10 KiB");
  EXPECT_EQ(HumanizeBytes(12 * kMiB), "12 MiB");
  EXPECT_EQ(HumanizeBytes(3 * kGiB / 2), "1.5 GiB");
  EXPECT_EQ(HumanizeBytes(16 * kGiB), "16 GiB");
  EXPECT_EQ(HumanizeBytes(2048 * kGiB), "2.0 TiB");
}

TEST(HumanizeBytes, RoundsUpToTheWholeNumberFormat) {
  // 9.96 KiB rounds to 10.0: printed without a decimal.
  EXPECT_EQ(HumanizeBytes(10199), "10 KiB");
}

TEST(HumanizeDuration, PicksTheTwoLargestUnits) {
  EXPECT_EQ(HumanizeDuration(0), "0.0s");
  EXPECT_EQ(HumanizeDuration(-3), "0.0s");
  EXPECT_EQ(HumanizeDuration(0.4), "0.4s");
  EXPECT_EQ(HumanizeDuration(9.5), "9.5s");
  EXPECT_EQ(HumanizeDuration(42), "42s");
  EXPECT_EQ(HumanizeDuration(185), "3m05s");
  EXPECT_EQ(HumanizeDuration(3600), "1h00m");
  EXPECT_EQ(HumanizeDuration(7830), "2h10m");
  EXPECT_EQ(HumanizeDuration(277200), "3d05h");
}

TEST(StateNames, DropTheEnumPrefix) {
  EXPECT_EQ(JobStateName(v1::JOB_STATE_RUNNING), "RUNNING");
  EXPECT_EQ(JobStateName(static_cast<v1::JobState>(42)), "UNKNOWN(42)");
  EXPECT_EQ(WorkerStateName(v1::WORKER_STATE_LOST), "LOST");
  EXPECT_TRUE(IsTerminal(v1::JOB_STATE_CANCELLED));
  EXPECT_FALSE(IsTerminal(v1::JOB_STATE_PAUSED));
}

TEST(FormatProgressLine, ShowsEveryFieldWithoutAWidth) {
  EXPECT_EQ(FormatProgressLine(RunningJob(), 0),
            "job-3 RUNNING [############--------]  60% step 1125/1875 epoch 1"
            "  loss 0.4123  acc 85.2%  1830 samples/s  stages busy 81% 77% "
            "90%");
}

TEST(FormatProgressLine, WideTerminalGetsTheWidestBar) {
  EXPECT_EQ(FormatProgressLine(RunningJob(), 140),
            "job-3 RUNNING [##################------------]  60% step "
            "1125/1875 epoch 1  loss 0.4123  acc 85.2%  1830 samples/s  "
            "stages busy 81% 77% 90%");
}

TEST(FormatProgressLine, BarShrinksToFillTheWidthExactly) {
  const std::string line = FormatProgressLine(RunningJob(), 120);
  EXPECT_EQ(line,
            "job-3 RUNNING [######-----]  60% step 1125/1875 epoch 1  loss "
            "0.4123  acc 85.2%  1830 samples/s  stages busy 81% 77% 90%");
  EXPECT_EQ(line.size(), 120u);
}

TEST(FormatProgressLine, DropsTrailingFieldsOnNarrowTerminals) {
  EXPECT_EQ(FormatProgressLine(RunningJob(), 100),
            "job-3 RUNNING [#########-------]  60% step 1125/1875 epoch 1  "
            "loss 0.4123  acc 85.2%  1830 samples/s");
  EXPECT_EQ(FormatProgressLine(RunningJob(), 79),
            "job-3 RUNNING [######-----]  60% step 1125/1875 epoch 1  loss "
            "0.4123  acc 85.2%");
}

TEST(FormatProgressLine, DropsTheBarThenCutsWhenNothingElseFits) {
  EXPECT_EQ(FormatProgressLine(RunningJob(), 50),
            "job-3 RUNNING  60% step 1125/1875 epoch 1");
  EXPECT_EQ(FormatProgressLine(RunningJob(), 30),
            "job-3 RUNNING  60% step 1125/1");
}

TEST(FormatProgressLine, BarKeepsItsWidthAsTheStepGrows) {
  v1::Job early = RunningJob();
  early.set_step(75);
  EXPECT_EQ(FormatProgressLine(early, 0),
            "job-3 RUNNING [--------------------]   4% step   75/1875 epoch 1"
            "  loss 0.4123  acc 85.2%  1830 samples/s  stages busy 81% 77% "
            "90%");
  const std::string a = FormatProgressLine(early, 100);
  const std::string b = FormatProgressLine(RunningJob(), 100);
  EXPECT_EQ(a.find(']'), b.find(']')) << a << "\n" << b;
}

TEST(FormatProgressLine, PendingJobShowsOnlyItsPosition) {
  v1::Job job;
  job.set_id("job-7");
  job.set_state(v1::JOB_STATE_PENDING);
  EXPECT_EQ(FormatProgressLine(job, 0),
            "job-7 PENDING [--------------------]   0% step 0 epoch 0");
}

TEST(FormatProgressLine, CompletedJobHasAFullBar) {
  v1::Job job = RunningJob();
  job.set_state(v1::JOB_STATE_COMPLETED);
  job.set_step(1875);
  job.clear_stages();
  EXPECT_EQ(FormatProgressLine(job, 0),
            "job-3 COMPLETED [####################] 100% step 1875/1875 epoch "
            "1  loss 0.4123  acc 85.2%  1830 samples/s");
}

TEST(FormatFinalSummary, CompletedJobReportsLossAndTestAccuracy) {
  v1::Job job = RunningJob();
  job.set_state(v1::JOB_STATE_COMPLETED);
  job.set_step(1875);
  job.set_loss(0.3123);
  job.mutable_eval()->set_accuracy(0.869);
  job.mutable_eval()->set_samples(10000);
  job.mutable_eval()->set_loss(0.3712);
  EXPECT_EQ(FormatFinalSummary(job),
            "job-3 COMPLETED after 1875/1875 steps, final loss 0.3123\n"
            "test accuracy 86.9% on 10000 samples (loss 0.3712)");
}

TEST(FormatFinalSummary, FailedJobShowsItsError) {
  v1::Job job = RunningJob();
  job.set_state(v1::JOB_STATE_FAILED);
  job.set_step(120);
  job.set_error("stage 1: worker w-2 lost");
  EXPECT_EQ(FormatFinalSummary(job),
            "job-3 FAILED at step 120/1875: stage 1: worker w-2 lost");
}

TEST(FormatFinalSummary, CancelledJobShowsItsLastLoss) {
  v1::Job job = RunningJob();
  job.set_state(v1::JOB_STATE_CANCELLED);
  job.set_step(120);
  job.set_loss(0.9);
  EXPECT_EQ(FormatFinalSummary(job),
            "job-3 CANCELLED at step 120/1875, last loss 0.9000");
}

}  // namespace
}  // namespace ctl
}  // namespace pipetrain
