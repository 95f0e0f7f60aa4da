// Recovery end to end: a scheduler and worker processes on loopback train
// the Fashion-MNIST MLP with GPipe; a worker is SIGKILLed mid-training.
// With a spare worker, the spare takes the lost stage; without one, the job
// is re-planned onto the two workers left; and a worker started after such
// a re-plan is taken back in (elastic growth) at the next checkpoint. Each
// time the job completes and its final weights equal the in-process
// trainer's fault-free run within 1e-5 (absolute): data order is a
// function of (seed, step), and training resumes from the last committed
// checkpoint (every 50 steps; the kill waits for one), reloaded layer by
// layer under the old or the new cut. The recovery time (from the loss
// being seen to the next completed step) is printed. A worker killed while
// the finished job evaluates is replaced too: every stage is restored from
// the final checkpoint and the job is evaluated again, ending with the
// fault-free weights and test accuracy.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "services/http/test_http_client.h"
#include "services/rpc/grpc_util.h"
#include "tests/scheduler_cluster.h"

namespace pipetrain::testing {
namespace {

constexpr int64_t kSteps = 400;
constexpr int64_t kCheckpointEvery = 50;
// Weights: the pipeline equals the in-process trainer up to float
// summation order.
constexpr double kWeightAbs = 1e-5;

// The MLP with three wide layers of equal cost (and a small head), so a
// third stage pays. The first layer computes no input gradient (a third
// less work per sample and weight), so it is that much wider: 784x384
// forward and weight gradient = 2 x 301k multiply-adds per sample, as the
// 384x512 and 512x384 layers' 3 x 197k. The 2-stage plan carries two of
// them on its bottleneck, the 3-stage one a single one: the planner
// predicts a GPipe step 35-45% shorter, well past the 20% growth needs.
v1::TrainingSpec BalancedMlpSpec(int64_t steps) {
  v1::TrainingSpec spec = MlpSpec(steps);
  v1::ModelSpec* model = spec.mutable_model();
  model->set_name("mlp-784-384-512-384-10");
  model->clear_layers();
  const int widths[] = {784, 384, 512, 384, 10};
  for (int l = 0; l + 1 < 5; ++l) {
    if (l > 0) model->add_layers()->mutable_relu();
    v1::LinearSpec* linear = model->add_layers()->mutable_linear();
    linear->set_in_features(widths[l]);
    linear->set_out_features(widths[l + 1]);
  }
  return spec;
}

// A small MLP on synthetic data whose held-out split is large: its
// evaluation takes seconds through the pipeline (thousands of small
// micro-batches), training a fraction of that, so a kill lands inside the
// end-of-job evaluation.
constexpr int64_t kEvalSteps = 30;
constexpr int64_t kEvalSamples = 300'000;
constexpr int kEvalFeatures = 32;

v1::TrainingSpec LongEvaluationSpec() {
  v1::TrainingSpec spec = MlpSpec(kEvalSteps);
  v1::ModelSpec* model = spec.mutable_model();
  model->set_name("mlp-32-64-64-10");
  model->clear_input_shape();
  model->add_input_shape(kEvalFeatures);
  model->clear_layers();
  const int widths[] = {kEvalFeatures, 64, 64, 10};
  for (int l = 0; l + 1 < 4; ++l) {
    if (l > 0) model->add_layers()->mutable_relu();
    v1::LinearSpec* linear = model->add_layers()->mutable_linear();
    linear->set_in_features(widths[l]);
    linear->set_out_features(widths[l + 1]);
  }
  v1::SyntheticSource* data = spec.mutable_data()->mutable_synthetic();
  data->set_features(kEvalFeatures);
  data->set_classes(10);
  data->set_train_samples(kEvalSteps * spec.batch_size());
  data->set_eval_samples(kEvalSamples);
  spec.set_eval_every(0);
  return spec;
}

// Evaluations against the in-process trainer's, relative (the weights equal
// up to float summation order).
constexpr double kEvalRel = 1e-5;

class RecoveryE2eTest : public SchedulerTest {
 protected:
  // The planning inputs are pinned: with measured ones the spare could look
  // faster by noise (three workers timing their GEMMs at once on a busy
  // host, the spare alone later), and the job move onto it at the
  // checkpoint the kill waits for. One CI run killed a worker the job was
  // just moving onto, and the recovery was not the spare's.
  RecoveryE2eTest() {
    extra_worker_flags_ = {kPinnedSpeed, kOwnMachine};
    extra_scheduler_flags_ = PinnedLinkFlags();
  }

  // A fourth worker: the spare.
  void AddSpare() {
    AddWorker("z1");
    ASSERT_TRUE(WaitForWorkers(4, v1::WORKER_STATE_IDLE));
  }

  // Checks that `job`'s final weights equal the fault-free run of
  // `training` within kWeightAbs.
  void ExpectFaultFreeWeights(const std::string& what, const std::string& job,
                              const v1::TrainingSpec& training) {
    ExpectWeightsNear(JobWeights(job), ReferenceWeights(training), kWeightAbs,
                      what);
  }

  // Calls PauseJob or ResumeJob until the scheduler takes it (it refuses
  // while a recovery drives the job's stages).
  bool JobAction(const std::string& job, bool pause, double timeout_s = 60) {
    const auto deadline =
        std::chrono::steady_clock::now() +
        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    while (std::chrono::steady_clock::now() < deadline) {
      grpc::ClientContext ctx;
      ctx.set_deadline(DeadlineIn(30));
      v1::JobActionRequest request;
      request.set_job_id(job);
      v1::Job out;
      const grpc::Status s =
          pause ? scheduler_.stub->PauseJob(&ctx, request, &out)
                : scheduler_.stub->ResumeJob(&ctx, request, &out);
      if (s.ok()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  // Trains, kills the worker of stage 1 once a checkpoint is committed, and
  // checks the job completes with the fault-free weights. Returns the
  // finished job.
  v1::Job TrainThroughAKill(const std::string& what) {
    v1::TrainingSpec training = MlpSpec(kSteps);
    training.set_checkpoint_every(kCheckpointEvery);
    v1::JobSpec spec;
    *spec.mutable_training() = training;
    spec.set_num_stages(3);
    spec.set_schedule(v1::SCHEDULE_GPIPE);
    const v1::Job job = Submit(spec);
    const v1::ListCheckpointsResponse committed =
        WaitForCheckpoint(job.id(), 60);
    EXPECT_GT(committed.checkpoints_size(), 0)
        << GetJob(job.id()).DebugString();
    const v1::PlannedStage victim = GetPlan(job.id()).stages(1);
    Worker* worker = WorkerAt(victim.worker_address());
    EXPECT_NE(worker, nullptr);
    if (worker == nullptr) return job;
    worker->process->Signal(SIGKILL);
    const v1::Job done = WaitForState(job.id(), v1::JOB_STATE_COMPLETED, 300);
    EXPECT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.error();
    EXPECT_EQ(done.step(), kSteps);
    EXPECT_GE(done.restarts(), 1);
    // It resumed from a checkpoint, not from the start.
    EXPECT_GT(done.rollbacks_size(), 0);
    if (done.rollbacks_size() > 0) {
      EXPECT_GE(done.rollbacks(0).to_step(), kCheckpointEvery);
      EXPECT_EQ(done.rollbacks(0).to_step() % kCheckpointEvery, 0);
    }
    for (const v1::JobEvent& e : done.events()) {
      if (e.kind() == v1::JOB_EVENT_RECOVERED) {
        std::printf("%s: recovered in %.2f s (%s)\n", what.c_str(), e.seconds(),
                    e.message().c_str());
      }
    }
    ExpectWeightsNear(JobWeights(job.id()), ReferenceWeights(training),
                      kWeightAbs, what);
    return done;
  }
};

TEST_F(RecoveryE2eTest, ASpareTakesAKilledWorkersStageAndTheWeightsMatch) {
  AddSpare();
  const v1::Job done = TrainThroughAKill("spare");
  EXPECT_EQ(GetPlan(done.id()).stages_size(), 3);
  bool lost = false, recovered = false;
  for (const v1::JobEvent& e : done.events()) {
    lost = lost || e.kind() == v1::JOB_EVENT_WORKER_LOST;
    recovered = recovered || e.kind() == v1::JOB_EVENT_RECOVERED;
    EXPECT_NE(e.kind(), v1::JOB_EVENT_REPLANNED);
  }
  EXPECT_TRUE(lost);
  EXPECT_TRUE(recovered);
  // The checkpoints and the model export over REST.
  auto listed = testing_http::Send(scheduler_.http_port, "GET",
                                   "/v1/jobs/" + done.id() + "/checkpoints");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->status, 200) << listed->body;
  EXPECT_TRUE(absl::StrContains(listed->body, "\"numLayers\"")) << listed->body;
  auto model = testing_http::Send(scheduler_.http_port, "GET",
                                  "/v1/jobs/" + done.id() + "/model");
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ(model->status, 200) << model->body.substr(0, 200);
  // safetensors: an 8-byte little-endian header length, then JSON.
  ASSERT_GT(model->body.size(), 9u);
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) {
    header = header << 8 | static_cast<unsigned char>(model->body[i]);
  }
  EXPECT_LT(8 + header, model->body.size());
  EXPECT_EQ(model->body[8], '{');
}

// The end-of-job evaluation begins right after the final checkpoint (at
// the last step) is committed: the kill waits for its event. The job is
// recovered from that checkpoint (nothing trained again) onto the spare,
// evaluated again, and matches the fault-free run.
TEST_F(RecoveryE2eTest, AWorkerKilledWhileTheJobEvaluatesIsRecovered) {
  AddSpare();
  const v1::TrainingSpec training = LongEvaluationSpec();
  v1::JobSpec spec;
  *spec.mutable_training() = training;
  spec.set_num_stages(3);
  spec.set_schedule(v1::SCHEDULE_GPIPE);
  const v1::Job job = Submit(spec);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(120);
  bool evaluating = false;
  while (!evaluating && std::chrono::steady_clock::now() < deadline) {
    const v1::Job seen = GetJob(job.id());
    // Completed already: the evaluation ended before it was seen.
    ASSERT_NE(seen.state(), v1::JOB_STATE_COMPLETED);
    ASSERT_NE(seen.state(), v1::JOB_STATE_FAILED) << seen.error();
    for (const v1::JobEvent& e : seen.events()) {
      evaluating = evaluating || (e.kind() == v1::JOB_EVENT_CHECKPOINT &&
                                  e.step() == kEvalSteps);
    }
    if (!evaluating) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(evaluating) << "no final checkpoint";
  const auto killed_at = std::chrono::steady_clock::now();
  Worker* worker = WorkerAt(GetPlan(job.id()).stages(1).worker_address());
  ASSERT_NE(worker, nullptr);
  worker->process->Signal(SIGKILL);

  const v1::Job done = WaitForState(job.id(), v1::JOB_STATE_COMPLETED, 300);
  ASSERT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.error();
  std::printf("evaluation recovery: completed %.2f s after the kill\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                            killed_at)
                  .count());
  EXPECT_EQ(done.step(), kEvalSteps);
  EXPECT_EQ(done.restarts(), 1);
  // Restored at the last step: nothing was trained again.
  ASSERT_EQ(done.rollbacks_size(), 1);
  EXPECT_EQ(done.rollbacks(0).to_step(), kEvalSteps);
  EXPECT_EQ(GetPlan(done.id()).stages_size(), 3);
  // The loss was seen during the evaluation, after the final checkpoint.
  int final_checkpoint = -1, lost = -1, recovered = -1, completed = -1;
  for (int i = 0; i < done.events_size(); ++i) {
    const v1::JobEvent& e = done.events(i);
    if (e.kind() == v1::JOB_EVENT_CHECKPOINT && e.step() == kEvalSteps) {
      final_checkpoint = i;
    } else if (e.kind() == v1::JOB_EVENT_WORKER_LOST) {
      lost = i;
      EXPECT_TRUE(
          absl::StrContains(e.message(), "during the end-of-job evaluation"))
          << e.message();
    } else if (e.kind() == v1::JOB_EVENT_RECOVERED) {
      recovered = i;
      EXPECT_TRUE(absl::StrContains(e.message(), "evaluating again"))
          << e.message();
      std::printf("evaluation recovery: %s (%.2f s)\n", e.message().c_str(),
                  e.seconds());
    } else if (e.kind() == v1::JOB_EVENT_COMPLETED) {
      completed = i;
    }
  }
  if (recovered >= 0 && completed > recovered) {
    // How long an evaluation runs: the kill must land inside one.
    std::printf(
        "evaluation recovery: the evaluation again took %.2f s\n",
        (done.events(completed).unix_ms() - done.events(recovered).unix_ms()) /
            1000.0);
  }
  ASSERT_GE(final_checkpoint, 0);
  EXPECT_GT(lost, final_checkpoint);
  ASSERT_GT(recovered, lost);
  // Restored from the final checkpoint.
  EXPECT_EQ(done.events(recovered).step(), kEvalSteps);
  EXPECT_EQ(done.events(recovered).version(),
            done.events(final_checkpoint).version());
  ASSERT_EQ(done.evaluations_size(), 1);

  const ReferenceRun reference = TrainInProcess(training, -1, 0);
  EXPECT_EQ(done.eval().samples(), kEvalSamples);
  EXPECT_EQ(reference.eval.samples, kEvalSamples);
  EXPECT_NEAR(done.eval().accuracy(), reference.eval.accuracy,
              kEvalRel * reference.eval.accuracy);
  EXPECT_NEAR(done.eval().loss(), reference.eval.loss,
              kEvalRel * reference.eval.loss);
  ExpectFaultFreeWeights("evaluation", done.id(), training);
}

TEST_F(RecoveryE2eTest, WithoutASpareTheJobShrinksToTwoStagesAndMatches) {
  const v1::Job done = TrainThroughAKill("re-plan");
  EXPECT_EQ(GetPlan(done.id()).stages_size(), 2);
  bool replanned = false;
  for (const v1::JobEvent& e : done.events()) {
    replanned = replanned || (e.kind() == v1::JOB_EVENT_REPLANNED &&
                              absl::StrContains(e.message(), "3 to 2"));
  }
  EXPECT_TRUE(replanned);
}

// The asynchronous schedules recover too, from the checkpoint with empty
// weight stashes and a fresh warm-up, so their result is not expected to
// equal an uninterrupted run: the job completes every step, resumed from a
// checkpoint, and its test accuracy stays within a few points of the same
// schedule's uninterrupted run.
constexpr double kAsyncAccuracyPoints = 0.04;

TEST_F(RecoveryE2eTest, AsynchronousSchedulesRecoverAndStillLearn) {
  AddSpare();
  v1::TrainingSpec training = MlpSpec(kSteps);
  training.set_checkpoint_every(kCheckpointEvery);
  // These schedules update the weights once per micro-batch: at the
  // example's learning rate (0.05) asynchronous 1F1B diverges.
  training.mutable_optimizer()->mutable_sgd()->set_lr(0.01);
  // One run of `schedule`, its stage 1 worker SIGKILLed after the first
  // checkpoint when `kill`; a new spare is started after a kill.
  auto run = [&](v1::ScheduleKindProto schedule, bool kill) {
    v1::JobSpec spec;
    *spec.mutable_training() = training;
    spec.set_num_stages(3);
    spec.set_schedule(schedule);
    const v1::Job job = Submit(spec);
    if (kill) {
      EXPECT_GT(WaitForCheckpoint(job.id(), 60).checkpoints_size(), 0);
      Worker* victim = WorkerAt(GetPlan(job.id()).stages(1).worker_address());
      EXPECT_NE(victim, nullptr);
      if (victim != nullptr) victim->process->Signal(SIGKILL);
    }
    const v1::Job done = WaitForState(job.id(), v1::JOB_STATE_COMPLETED, 300);
    EXPECT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.error();
    EXPECT_EQ(done.step(), kSteps);
    if (kill) {
      AddWorker("z1");
      EXPECT_TRUE(WaitForWorkers(4, v1::WORKER_STATE_IDLE));
    }
    return done;
  };
  for (const v1::ScheduleKindProto schedule :
       {v1::SCHEDULE_ASYNC_1F1B, v1::SCHEDULE_2BW}) {
    SCOPED_TRACE(v1::ScheduleKindProto_Name(schedule));
    const v1::Job undisturbed = run(schedule, false);
    const v1::Job done = run(schedule, true);
    EXPECT_GE(done.restarts(), 1);
    ASSERT_GT(done.rollbacks_size(), 0);
    EXPECT_EQ(done.rollbacks(0).to_step() % kCheckpointEvery, 0);
    EXPECT_GE(done.rollbacks(0).to_step(), kCheckpointEvery);
    EXPECT_EQ(done.eval().samples(), undisturbed.eval().samples());
    EXPECT_NEAR(done.eval().accuracy(), undisturbed.eval().accuracy(),
                kAsyncAccuracyPoints);
    std::printf("%s: test accuracy %.4f after a recovery, %.4f without\n",
                v1::ScheduleKindProto_Name(schedule).c_str(),
                done.eval().accuracy(), undisturbed.eval().accuracy());
  }
}

using GrowthE2eTest = RecoveryE2eTest;

// Elastic growth: the job degraded to 2 stages by a killed worker takes in
// a worker started afterwards, at the next committed checkpoint, and still
// ends with the fault-free weights. The job is paused while the new worker
// starts, so that the growth is seen however fast the steps run.
TEST_F(GrowthE2eTest, ADegradedJobTakesInANewWorkerAndMatches) {
  v1::TrainingSpec training = BalancedMlpSpec(kSteps);
  training.set_checkpoint_every(kCheckpointEvery);
  // Eight micro-batches of 32 samples. Each wide layer's forward and
  // backward then take about a millisecond, so the profile the growth
  // decision rests on measures GEMMs, not the per-call overheads and
  // scheduling noise that dominate at 8 samples; and the per-step costs
  // the planner also counts (fill and drain, the first stage's optimizer
  // update after its last backward) stay small beside the micro-batches'
  // work (at M = 4 they left the predicted gain near the 20% threshold).
  training.set_micro_batches(8);
  training.set_batch_size(256);
  v1::JobSpec spec;
  *spec.mutable_training() = training;
  spec.set_num_stages(3);
  spec.set_schedule(v1::SCHEDULE_GPIPE);
  const v1::Job job = Submit(spec);
  ASSERT_GT(WaitForCheckpoint(job.id(), 60).checkpoints_size(), 0);
  Worker* victim = WorkerAt(GetPlan(job.id()).stages(1).worker_address());
  ASSERT_NE(victim, nullptr);
  victim->process->Signal(SIGKILL);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (GetPlan(job.id()).stages_size() != 2 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(GetPlan(job.id()).stages_size(), 2);
  ASSERT_TRUE(JobAction(job.id(), /*pause=*/true));
  const v1::Job paused = WaitForState(job.id(), v1::JOB_STATE_PAUSED, 60);
  ASSERT_EQ(paused.state(), v1::JOB_STATE_PAUSED) << paused.error();
  ASSERT_LT(paused.step() + 2 * kCheckpointEvery, kSteps)
      << "the job ran too far before the pause for a checkpoint to follow";
  auto joined = StartWorker({"--scheduler=" + scheduler_.address,
                             "--labels=zone=z0", kPinnedSpeed, kOwnMachine});
  ASSERT_TRUE(joined.ok()) << joined.status();
  workers_.push_back(std::move(*joined));
  ASSERT_TRUE(WaitForWorkers(1, v1::WORKER_STATE_IDLE));
  ASSERT_TRUE(JobAction(job.id(), /*pause=*/false));

  const v1::Job done = WaitForState(job.id(), v1::JOB_STATE_COMPLETED, 300);
  ASSERT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.error();
  EXPECT_EQ(done.step(), kSteps);
  EXPECT_EQ(GetPlan(done.id()).stages_size(), 3);
  bool shrank = false, grew = false;
  for (const v1::JobEvent& e : done.events()) {
    if (e.kind() != v1::JOB_EVENT_REPLANNED) continue;
    shrank = shrank || absl::StrContains(e.message(), "3 to 2");
    if (absl::StrContains(e.message(), "grew from 2 to 3 stages")) {
      grew = true;
      EXPECT_EQ(e.step() % kCheckpointEvery, 0) << e.message();
      std::printf("growth: %s\n", e.message().c_str());
    }
  }
  EXPECT_TRUE(shrank);
  EXPECT_TRUE(grew);
  if (!grew) {
    for (const v1::JobEvent& e : done.events()) {
      std::printf("event at step %lld: %s\n", static_cast<long long>(e.step()),
                  e.message().c_str());
    }
  }
  ExpectFaultFreeWeights("growth", done.id(), training);
}

}  // namespace
}  // namespace pipetrain::testing
