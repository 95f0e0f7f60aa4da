// Evaluation passes through K stage executors connected in memory: on
// request they give exactly what the in-process trainer's Evaluate gives on
// the same weights, and with TrainingSpec.eval_every they run at the right
// steps without changing what a synchronous pipeline learns, while the
// cross-step schedules drain for them as if paused there.
#include "worker/pipeline/stage_evaluation.h"

#include <cmath>
#include <map>
#include <string>

#include "gtest/gtest.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/pipeline/in_memory_pipeline.h"
#include "worker/pipeline/local_trainer.h"
#include "worker/pipeline/pipedream_reference.h"

namespace pipetrain {
namespace {

// LocalTrainer::Evaluate of `spec`'s model holding `weights` (the whole
// model's parameters in order).
absl::StatusOr<EvalReport> ReferenceEvaluation(
    const v1::TrainingSpec& spec, const std::vector<Tensor>& weights,
    int64_t max_samples) {
  auto backend = CreateCpuBackend(1);
  auto trainer = LocalTrainer::Create(spec, backend.get());
  if (!trainer.ok()) return trainer.status();
  absl::Status loaded = (*trainer)->model()->LoadParams(weights);
  if (!loaded.ok()) return loaded;
  return (*trainer)->Evaluate(max_samples);
}

// `want`'s weights reordered as the whole model's parameters.
std::vector<Tensor> InModelOrder(
    const v1::TrainingSpec& spec,
    const std::map<std::string, std::vector<float>>& by_name) {
  auto backend = CreateCpuBackend(1);
  auto model = Model::Build(spec.model(), 0, spec.model().layers_size(),
                            backend.get(), spec.seed());
  EXPECT_TRUE(model.ok());
  std::vector<Tensor> out;
  for (const Param* p : (*model)->params()) {
    const std::vector<float>& values = by_name.at(p->name);
    out.push_back(Tensor::HostFrom(p->value.shape(), values));
  }
  return out;
}

void ExpectSameEvaluation(const v1::EvalResult& got, const EvalReport& want,
                          double relative) {
  EXPECT_NEAR(got.loss(), want.loss, relative * want.loss);
  EXPECT_NEAR(got.accuracy(), want.accuracy, relative * want.accuracy);
  EXPECT_EQ(got.samples(), want.samples);
}

// Every stage's answer is fine; the last stage's carries the result, the
// others' are empty.
v1::EvalResult LastStagesResult(
    const std::vector<absl::StatusOr<v1::EvalResult>>& results) {
  for (size_t s = 0; s < results.size(); ++s) {
    EXPECT_TRUE(results[s].ok())
        << "stage " << s << ": " << results[s].status();
    if (!results[s].ok()) return v1::EvalResult();
    if (s + 1 < results.size()) {
      EXPECT_EQ(results[s]->samples(), 0);
    }
  }
  return *results.back();
}

// 64 held-out samples, batches of 32 in 4 micro-batches of 8: all of them,
// and 50 (a short last batch and a 2-row last micro-batch).
TEST(StageEvaluation, EqualsTheLocalTrainersOnTheSameWeights) {
  for (const std::vector<int>& cuts :
       {std::vector<int>{}, std::vector<int>{3}, std::vector<int>{2, 5}}) {
    SCOPED_TRACE(::testing::Message() << "K=" << cuts.size() + 1);
    v1::TrainingSpec spec = SmallMlpSpec(4, false);
    spec.set_steps(3);
    Pipeline p = BuildPipeline(spec, cuts);
    ASSERT_TRUE(TrainAll(p, spec.steps()).ok());
    const std::vector<Tensor> weights = WeightsInOrder(p);
    for (int64_t max_samples : {0, 50}) {
      auto want = ReferenceEvaluation(spec, weights, max_samples);
      ASSERT_TRUE(want.ok()) << want.status();
      EXPECT_EQ(want->samples, max_samples == 0 ? 64 : 50);
      const v1::EvalResult got = LastStagesResult(EvaluateAll(p, max_samples));
      ExpectSameEvaluation(got, *want, 1e-6);
      EXPECT_EQ(got.step(), 3);
    }
    const auto status = p.stages.back()->GetStatus(0);
    ASSERT_EQ(status.evaluations_size(), 2);
    EXPECT_EQ(status.evaluations(0).samples(), 64);
    EXPECT_EQ(status.evaluations(1).samples(), 50);
    EXPECT_EQ(p.stages.front()->GetStatus(0).evaluations_size(),
              cuts.empty() ? 2 : 0);
    // Nothing was left behind in a mailbox.
    for (auto& stage : p.stages) EXPECT_EQ(stage->mailbox()->size(), 0u);
  }
}

// Interleaved: each micro-batch runs through the chunks in virtual-stage
// order, wrapping from the last worker to worker 0.
TEST(StageEvaluation, InterleavedFollowsTheChunkOrder) {
  for (int k : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << "K=" << k << " v=2");
    v1::TrainingSpec spec = SmallMlpSpec(4, false);
    spec.set_steps(2);
    Pipeline p = BuildInterleaved(
        spec, k, 2, k == 1 ? std::vector<int>{3} : std::vector<int>{2, 4, 5});
    ASSERT_TRUE(TrainAll(p, spec.steps()).ok());
    const std::vector<Tensor> weights = InModelOrder(spec, WeightsByName(p));
    for (int64_t max_samples : {0, 50}) {
      auto want = ReferenceEvaluation(spec, weights, max_samples);
      ASSERT_TRUE(want.ok()) << want.status();
      ExpectSameEvaluation(LastStagesResult(EvaluateAll(p, max_samples)), *want,
                           1e-6);
    }
  }
}

// eval_every = 2 over 6 GPipe steps: evaluations after steps 2, 4 and 6,
// equal to pausing there and evaluating, and training is unchanged.
TEST(StageEvaluation, EvalEveryOnGPipe) {
  v1::TrainingSpec plain = SmallMlpSpec(4, false);
  v1::TrainingSpec every = plain;
  every.set_eval_every(2);
  Pipeline with = BuildPipeline(every, {2, 5});
  ASSERT_TRUE(TrainAll(with, every.steps()).ok());
  // The same training without eval_every, paused every 2 steps to evaluate.
  Pipeline paused = BuildPipeline(plain, {2, 5});
  std::vector<v1::EvalResult> want;
  for (int64_t until : {2, 4, 6}) {
    ASSERT_TRUE(TrainAll(paused, until).ok());
    want.push_back(LastStagesResult(EvaluateAll(paused, 0)));
  }
  const v1::GetStatusResponse status = with.stages.back()->GetStatus(0);
  ASSERT_EQ(status.evaluations_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(status.evaluations(i).step(), 2 * (i + 1));
    EXPECT_EQ(status.evaluations(i).samples(), 64);
    EXPECT_NEAR(status.evaluations(i).loss(), want[i].loss(),
                1e-6 * want[i].loss());
    EXPECT_EQ(status.evaluations(i).accuracy(), want[i].accuracy());
  }
  for (size_t s = 0; s + 1 < with.stages.size(); ++s) {
    EXPECT_EQ(with.stages[s]->GetStatus(0).evaluations_size(), 0);
  }
  EXPECT_EQ(with.stages.back()->GetStatus(5).evaluations_size(), 1);
  const v1::GetStatusResponse plain_status = paused.stages.back()->GetStatus(0);
  ASSERT_EQ(plain_status.results_size(), status.results_size());
  for (int t = 0; t < status.results_size(); ++t) {
    EXPECT_NEAR(status.results(t).loss(), plain_status.results(t).loss(),
                1e-6 * plain_status.results(t).loss());
  }
  const auto got = WeightsByName(with);
  const auto base = WeightsByName(paused);
  ASSERT_EQ(got.size(), base.size());
  for (const auto& [name, values] : base) {
    const std::vector<float>& g = got.at(name);
    ASSERT_EQ(g.size(), values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_NEAR(g[i], values[i], 1e-6 * std::fabs(values[i])) << name << i;
    }
  }
}

// True when no backward of step t - 1 ran after the first forward of step
// t on this stage: the pipeline drained between them.
bool DrainedBefore(const v1::GetTraceResponse& trace, int64_t t) {
  bool forward_of_t = false;
  for (const auto& e : trace.events()) {
    if (e.op() == "F" && e.step() == t) forward_of_t = true;
    if (e.op() == "B" && e.step() == t - 1 && forward_of_t) return false;
  }
  return true;
}

// eval_every = 2 over 5 steps of the cross-step schedules: every stage
// drains after steps 2 and 4 (evaluates) and warms up again, so training
// is the PipeDream reference's with run segments starting at steps 2 and
// 4, and each evaluation is LocalTrainer::Evaluate on the reference's
// weights at that step.
TEST(StageEvaluation, EvalEveryOnCrossStepSchedulesDrainsThePipeline) {
  for (v1::ScheduleKindProto schedule :
       {v1::SCHEDULE_2BW, v1::SCHEDULE_ASYNC_1F1B}) {
    SCOPED_TRACE(v1::ScheduleKindProto_Name(schedule));
    v1::TrainingSpec spec = SmallMlpSpec(8, false);
    spec.mutable_optimizer()->set_clip_grad_norm(0);
    spec.set_steps(5);
    spec.set_eval_every(2);
    PipeDreamRun run;
    run.schedule = schedule;
    run.cuts = {2, 5};
    run.segment_starts = {2, 4};
    auto reference = RunPipeDreamReference(spec, run);
    ASSERT_TRUE(reference.ok()) << reference.status();

    Pipeline p = BuildPipeline(spec, run.cuts, schedule);
    ASSERT_TRUE(TrainAll(p, spec.steps()).ok());
    const v1::GetStatusResponse status = p.stages.back()->GetStatus(0);
    ASSERT_EQ(status.evaluations_size(), 2);
    for (int i = 0; i < 2; ++i) {
      const int64_t step = 2 * (i + 1);
      EXPECT_EQ(status.evaluations(i).step(), step);
      auto want =
          ReferenceEvaluation(spec, reference->weights_after_step[step - 1], 0);
      ASSERT_TRUE(want.ok()) << want.status();
      ExpectSameEvaluation(status.evaluations(i), *want, 1e-5);
    }
    for (int t = 0; t < spec.steps(); ++t) {
      EXPECT_NEAR(status.results(t).loss(), reference->losses[t],
                  1e-5 * reference->losses[t])
          << "step " << t;
    }
    const v1::GetTraceResponse trace = p.stages[0]->Trace(0);
    EXPECT_TRUE(DrainedBefore(trace, 2));
    EXPECT_TRUE(DrainedBefore(trace, 4));
    EXPECT_FALSE(DrainedBefore(trace, 1));  // steps 0 and 1 overlap
    EXPECT_FALSE(DrainedBefore(trace, 3));
  }
}

TEST(StageEvaluation, WhileTrainingAndBadMessagesAreRefused) {
  v1::TrainingSpec spec = SmallMlpSpec(4, false);
  spec.set_steps(100000);
  Pipeline p = BuildPipeline(spec, {3});
  for (auto& stage : p.stages) ASSERT_TRUE(stage->Train(spec.steps()).ok());
  EXPECT_EQ(p.stages[1]->Evaluate(0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  for (auto& stage : p.stages) stage->Stop();
  EXPECT_EQ(p.stages[1]->Evaluate(-1).status().code(),
            absl::StatusCode::kInvalidArgument);

  Pipeline idle = BuildPipeline(SmallMlpSpec(4, false), {3});
  StageMessage good;
  good.kind = MessageKind::kEvalActivation;
  good.micro_batch = 7;  // an evaluation numbers its micro-batches on
  good.samples = 64;
  good.tensors = {Tensor::Host({2, 32})};
  EXPECT_TRUE(idle.stages[1]->ValidateIncoming(good).ok())
      << idle.stages[1]->ValidateIncoming(good);
  StageMessage bad = good;
  bad.tensors = {Tensor::Host({9, 32})};  // > 8 rows
  EXPECT_EQ(idle.stages[1]->ValidateIncoming(bad).code(),
            absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.step = 2;  // a pass two ahead
  EXPECT_EQ(idle.stages[1]->ValidateIncoming(bad).code(),
            absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.value = 3;
  EXPECT_EQ(idle.stages[1]->ValidateIncoming(bad).code(),
            absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.tensors.push_back(Tensor::Host({2}));  // labels do not travel
  EXPECT_EQ(idle.stages[1]->ValidateIncoming(bad).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(idle.stages[0]->ValidateIncoming(good).code(),
            absl::StatusCode::kInvalidArgument);  // stage 0 takes none
}

}  // namespace
}  // namespace pipetrain
