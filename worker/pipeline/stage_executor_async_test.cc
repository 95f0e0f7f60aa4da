// The cross-step schedules (PipeDream's asynchronous 1F1B, with and
// without vertical sync, and PipeDream-2BW) on K stage executors connected
// in memory: weight stashing, overlapping steps, pausing, and learning.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>

#include "common/proto_json.h"
#include "gtest/gtest.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/pipeline/in_memory_pipeline.h"
#include "worker/pipeline/local_trainer.h"
#include "worker/pipeline/stage_executor.h"

namespace pipetrain {
namespace {

// (step, micro-batch) -> weight version of an op, from one stage's trace.
std::map<std::pair<int64_t, int>, int64_t> VersionsOf(
    const v1::GetTraceResponse& trace, const std::string& op) {
  std::map<std::pair<int64_t, int>, int64_t> out;
  for (const auto& e : trace.events()) {
    if (e.op() == op) out[{e.step(), e.micro_batch()}] = e.weight_version();
  }
  return out;
}

// (step, micro-batch) -> checksum of the weights an op ran with.
std::map<std::pair<int64_t, int>, uint64_t> ChecksumsOf(
    const v1::GetTraceResponse& trace, const std::string& op) {
  std::map<std::pair<int64_t, int>, uint64_t> out;
  for (const auto& e : trace.events()) {
    if (e.op() == op) out[{e.step(), e.micro_batch()}] = e.weight_checksum();
  }
  return out;
}

// Each micro-batch's backward ran with exactly the weights its forward ran
// with (checksums taken where each ran), and within the stage a version
// always means the same weights and different versions different ones.
void ExpectBackwardsUsedTheForwardsWeights(const v1::GetTraceResponse& trace) {
  const auto forward = ChecksumsOf(trace, "F");
  const auto backward = ChecksumsOf(trace, "B");
  ASSERT_EQ(backward.size(), forward.size());
  for (const auto& [key, checksum] : forward) {
    EXPECT_NE(checksum, 0u);
    EXPECT_EQ(backward.at(key), checksum)
        << "step " << key.first << " mb " << key.second;
  }
  std::map<int64_t, uint64_t> by_version;
  std::map<uint64_t, int64_t> by_checksum;
  for (const auto& e : trace.events()) {
    if (e.op() != "F" && e.op() != "B") continue;
    const auto v = by_version.emplace(e.weight_version(), e.weight_checksum());
    EXPECT_EQ(v.first->second, e.weight_checksum())
        << e.op() << " step " << e.step() << " mb " << e.micro_batch()
        << " claims version " << e.weight_version();
    const auto c = by_checksum.emplace(e.weight_checksum(), e.weight_version());
    EXPECT_EQ(c.first->second, e.weight_version())
        << "versions " << c.first->second << " and " << e.weight_version()
        << " ran with the same weights";
  }
}

StageOptions Checksummed() {
  StageOptions options;
  options.checksum_weights = true;
  return options;
}

// 2BW's Fashion-MNIST learning rate (SGD, momentum 0.9 from the job): the
// one-step-stale gradients diverge at 0.1, reach ~83% at the job's 0.05 and
// ~86.7% at 0.02 within the job's epochs.
constexpr float kTwoBWLearningRate = 0.02f;

v1::TrainingSpec AsyncSpec() {
  v1::TrainingSpec spec = SmallMlpSpec(8, false);
  spec.mutable_optimizer()->set_clip_grad_norm(0);
  spec.set_steps(4);
  return spec;
}

// True when stage `trace` ran a backward of step t - 1 after the first
// forward of some step t: the pipeline did not drain between the steps.
bool RanAcrossSteps(const v1::GetTraceResponse& trace) {
  std::map<int64_t, bool> forward_seen;  // step -> a forward of it ran
  for (const auto& e : trace.events()) {
    if (e.op() == "F") forward_seen[e.step()] = true;
    if (e.op() == "B" && forward_seen[e.step() + 1]) return true;
  }
  return false;
}

// PipeDream: each backward uses the weights its forward used, stage s
// never holds more than K - s weight versions, and the steps overlap (no
// flush between them).
TEST(StageExecutor, AsyncOneFOneBStashesTheForwardsWeights) {
  for (const std::vector<int>& cuts :
       {std::vector<int>{3}, std::vector<int>{2, 5}}) {
    const int k = static_cast<int>(cuts.size()) + 1;
    const v1::TrainingSpec spec = AsyncSpec();
    Pipeline p = BuildPipeline(spec, cuts, v1::SCHEDULE_ASYNC_1F1B, false,
                               Checksummed());
    for (auto& stage : p.stages) ASSERT_TRUE(stage->Train(spec.steps()).ok());
    for (auto& stage : p.stages) ASSERT_TRUE(stage->Wait().ok());
    bool saw_stale = false;
    for (int s = 0; s < k; ++s) {
      // The last step's peak (steady state and cool-down).
      EXPECT_LE(p.stages[s]->GetStatus(0).stash_depth(), k - s)
          << "stage " << s;
      const v1::GetTraceResponse trace = p.stages[s]->Trace(0);
      const auto forward = VersionsOf(trace, "F");
      const auto backward = VersionsOf(trace, "B");
      ASSERT_EQ(forward.size(), static_cast<size_t>(spec.steps() * 8));
      ASSERT_EQ(backward.size(), forward.size());
      for (const auto& [key, version] : forward) {
        EXPECT_EQ(backward.at(key), version)
            << "stage " << s << " step " << key.first << " mb " << key.second;
      }
      {
        SCOPED_TRACE(::testing::Message() << "K=" << k << " stage " << s);
        ExpectBackwardsUsedTheForwardsWeights(trace);
      }
      // The stage updated between some forward and its backward (the
      // update after micro-batch m's backward moved past m's version), so
      // the stash was really exercised.
      const auto steps = VersionsOf(trace, "Step");
      for (const auto& [key, version] : forward) {
        auto it = steps.find({key.first, key.second});
        if (it != steps.end() && it->second > version) saw_stale = true;
      }
      EXPECT_EQ(p.stages[s]->GetStatus(0).weight_version(), spec.steps() * 8);
      // Stages with a warm-up run the previous step's tail in a step.
      EXPECT_EQ(RanAcrossSteps(trace), s < k - 1) << "stage " << s;
    }
    if (k > 1) {
      EXPECT_TRUE(saw_stale) << "no backward ran on stashed weights";
    }
  }
}

// Pausing an asynchronous pipeline: only stage 0 is told; every stage
// follows it, drains (cool-down) and stops at the same step with nothing in
// flight; resuming warms up again and the versions keep counting.
TEST(StageExecutor, AsyncTargetsMoveWhileTrainingToPauseAndResume) {
  for (v1::ScheduleKindProto schedule :
       {v1::SCHEDULE_ASYNC_1F1B, v1::SCHEDULE_2BW}) {
    SCOPED_TRACE(v1::ScheduleKindProto_Name(schedule));
    const int64_t updates_per_step = schedule == v1::SCHEDULE_2BW ? 1 : 8;
    v1::TrainingSpec spec = AsyncSpec();
    spec.set_steps(100000);
    Pipeline p = BuildPipeline(spec, {2, 5}, schedule);
    for (auto& stage : p.stages) ASSERT_TRUE(stage->Train(spec.steps()).ok());
    // Pause mid-run: once the last stage finished a step (a fixed sleep
    // was too short on a loaded machine, before stage 0 had begun).
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (p.stages.back()->next_step() < 1 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    auto target = p.stages[0]->Train(0);
    ASSERT_TRUE(target.ok());
    EXPECT_GT(*target, 1);
    // The scheduler's protocol; the later stages would follow stage 0
    // without it.
    for (size_t s = 1; s < p.stages.size(); ++s) {
      auto got = p.stages[s]->Train(*target);
      ASSERT_TRUE(got.ok());
      EXPECT_EQ(*got, *target);
    }
    for (auto& stage : p.stages) ASSERT_TRUE(stage->Wait().ok());
    for (auto& stage : p.stages) {
      EXPECT_EQ(stage->next_step(), *target);
      EXPECT_EQ(stage->GetStatus(0).state(), v1::STAGE_STATE_DONE);
      // Every update of every step ran: nothing was left in flight.
      EXPECT_EQ(stage->GetStatus(0).weight_version(),
                *target * updates_per_step);
      EXPECT_EQ(stage->mailbox()->size(), 0u);
      const v1::GetTraceResponse trace = stage->Trace(*target - 1);
      EXPECT_EQ(VersionsOf(trace, "B").count({*target - 1, 7}), 1u);
    }
    for (auto& stage : p.stages) ASSERT_TRUE(stage->Train(*target + 3).ok());
    for (auto& stage : p.stages) ASSERT_TRUE(stage->Wait().ok());
    for (auto& stage : p.stages) {
      EXPECT_EQ(stage->next_step(), *target + 3);
      EXPECT_EQ(stage->GetStatus(0).weight_version(),
                (*target + 3) * updates_per_step);
    }
    EXPECT_EQ(p.stages[2]->GetStatus(0).results_size(), *target + 3);
  }
}

// A deep warm-up (CrossStepWarmup = M on stage 0) runs stage 0's whole
// first step as forwards, so it sends the next step's first activation
// with no gradient back yet: stage 1 takes it even before it is told to
// train (its step 0 activations said the run goes on), and the pipeline
// trains exactly as one started last stage first, as the scheduler does.
TEST(StageExecutor, AStageTakesTheStepItsUpstreamCommittedToBeforeItTrains) {
  const v1::TrainingSpec spec = AsyncSpec();
  auto deep = [](v1::StageConfig* c) { c->set_extra_warmup(3); };
  Pipeline want =
      BuildPipeline(spec, {2, 5}, v1::SCHEDULE_ASYNC_1F1B, false, {}, deep);
  for (size_t s = want.stages.size(); s-- > 0;) {
    ASSERT_TRUE(want.stages[s]->Train(spec.steps()).ok());
  }
  for (auto& stage : want.stages) ASSERT_TRUE(stage->Wait().ok());

  Pipeline p =
      BuildPipeline(spec, {2, 5}, v1::SCHEDULE_ASYNC_1F1B, false, {}, deep);
  ASSERT_TRUE(p.stages[0]->Train(spec.steps()).ok());
  auto sent_step_one = [&p] {
    const v1::GetTraceResponse trace = p.stages[0]->Trace(0);
    for (const auto& e : trace.events()) {
      if (e.op() == "SendA" && e.step() == 1) return true;
    }
    return false;
  };
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!sent_step_one() &&
         p.stages[0]->GetStatus(0).state() != v1::STAGE_STATE_FAILED &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(p.stages[0]->GetStatus(0).state(), v1::STAGE_STATE_RUNNING)
      << p.stages[0]->Wait();
  ASSERT_TRUE(sent_step_one());
  EXPECT_EQ(p.stages[1]->next_step(), 0);
  for (size_t s = 1; s < p.stages.size(); ++s) {
    ASSERT_TRUE(p.stages[s]->Train(spec.steps()).ok());
  }
  for (auto& stage : p.stages) ASSERT_TRUE(stage->Wait().ok()) << stage->Wait();
  const auto got = p.stages.back()->GetStatus(0);
  const auto reference = want.stages.back()->GetStatus(0);
  ASSERT_EQ(got.results_size(), spec.steps());
  ASSERT_EQ(reference.results_size(), spec.steps());
  for (int t = 0; t < spec.steps(); ++t) {
    EXPECT_EQ(got.results(t).loss(), reference.results(t).loss())
        << "step " << t;
  }
  EXPECT_EQ(WeightsByName(p), WeightsByName(want));
}

// PipeDream-2BW: one update per step, right after its last backward; every
// micro-batch of step t runs forward and backward with version
// max(0, t - 1) (the version after step t - 2's update: W(t+1) = W(t) -
// lr grad(W(t-1))) on every stage, so at most two versions are live (one
// stashed copy), and the steps overlap.
TEST(StageExecutor, TwoBWDoubleBuffersTheWeights) {
  v1::TrainingSpec spec = AsyncSpec();
  spec.set_steps(5);
  Pipeline p =
      BuildPipeline(spec, {2, 5}, v1::SCHEDULE_2BW, false, Checksummed());
  for (auto& stage : p.stages) ASSERT_TRUE(stage->Train(spec.steps()).ok());
  for (auto& stage : p.stages) ASSERT_TRUE(stage->Wait().ok()) << stage->Wait();
  const int k = static_cast<int>(p.stages.size());
  for (int s = 0; s < k; ++s) {
    SCOPED_TRACE(::testing::Message() << "stage " << s);
    EXPECT_LE(p.stages[s]->GetStatus(0).stash_depth(), 1);
    EXPECT_EQ(p.stages[s]->GetStatus(0).weight_version(), spec.steps());
    const v1::GetTraceResponse trace = p.stages[s]->Trace(0);
    const auto forward = VersionsOf(trace, "F");
    const auto backward = VersionsOf(trace, "B");
    ASSERT_EQ(forward.size(), static_cast<size_t>(spec.steps() * 8));
    EXPECT_EQ(backward, forward);
    ExpectBackwardsUsedTheForwardsWeights(trace);
    for (const auto& [key, version] : forward) {
      EXPECT_EQ(version, std::max<int64_t>(0, key.first - 1))
          << "step " << key.first << " mb " << key.second;
    }
    // One update per step, after its last micro-batch's backward: step
    // t's update turns version t into t + 1.
    const auto steps = VersionsOf(trace, "Step");
    ASSERT_EQ(steps.size(), static_cast<size_t>(spec.steps()));
    for (int64_t t = 0; t < spec.steps(); ++t) {
      EXPECT_EQ(steps.at({t, 7}), t);
    }
    EXPECT_EQ(RanAcrossSteps(trace), s < k - 1);
  }
  // The last stage reports each step's complete loss.
  const auto status = p.stages.back()->GetStatus(0);
  ASSERT_EQ(status.results_size(), spec.steps());
  for (const auto& r : status.results()) EXPECT_GT(r.loss(), 0.0);
}

// Every stage's forward and backward of a micro-batch ran with the
// version stage 0's forward used, and (checksums) with that version's
// weights.
TEST(StageExecutor, VerticalSyncUsesStageZerosVersionEverywhere) {
  const v1::TrainingSpec spec = AsyncSpec();
  Pipeline p =
      BuildPipeline(spec, {2, 5}, v1::SCHEDULE_ASYNC_1F1B, true, Checksummed());
  for (auto& stage : p.stages) ASSERT_TRUE(stage->Train(spec.steps()).ok());
  for (auto& stage : p.stages) ASSERT_TRUE(stage->Wait().ok()) << stage->Wait();
  const v1::GetTraceResponse trace0 = p.stages[0]->Trace(0);
  const auto first = VersionsOf(trace0, "F");
  ASSERT_EQ(first.size(), static_cast<size_t>(spec.steps() * 8));
  ExpectBackwardsUsedTheForwardsWeights(trace0);
  bool older = false;
  for (size_t s = 1; s < p.stages.size(); ++s) {
    SCOPED_TRACE(::testing::Message() << "stage " << s);
    const v1::GetTraceResponse trace = p.stages[s]->Trace(0);
    EXPECT_EQ(VersionsOf(trace, "F"), first);
    EXPECT_EQ(VersionsOf(trace, "B"), first);
    ExpectBackwardsUsedTheForwardsWeights(trace);
    // Some forward ran with a version older than the stage's live one
    // (the updates it had run so far, in execution order): the stash
    // served stage 0's version.
    int64_t live = 0;
    for (const auto& e : trace.events()) {
      if (e.op() == "Step") ++live;
      if (e.op() == "F" && e.weight_version() < live) older = true;
    }
  }
  EXPECT_TRUE(older) << "vertical sync never needed an older version";
}

TEST(StageExecutor, AsyncRejectsGlobalClippingAndStrayVerticalSync) {
  v1::StageConfig config;
  config.set_job_id("job");
  *config.mutable_spec() = SmallMlpSpec(4, false);  // clips the gradient norm
  config.set_num_stages(1);
  config.set_layer_end(7);
  config.set_schedule(v1::SCHEDULE_ASYNC_1F1B);
  auto backend = CreateCpuBackend(1);
  auto stage = StageExecutor::Create(config, backend.get());
  EXPECT_NE(stage.status().message().find("clip_grad_norm"), std::string::npos)
      << stage.status();
  config.set_schedule(v1::SCHEDULE_GPIPE);
  config.set_vertical_sync(true);
  stage = StageExecutor::Create(config, backend.get());
  EXPECT_NE(stage.status().message().find("vertical_sync"), std::string::npos)
      << stage.status();
}

// Async 1F1B trains the Fashion-MNIST MLP (3 stages) to >= 85% accuracy.
TEST(StageExecutor, AsyncOneFOneBLearnsFashionMnist) {
  v1::TrainingSpec spec;
  const char* root = std::getenv("PIPETRAIN_SOURCE_DIR");
  ASSERT_TRUE(ReadJsonFile(std::string(root != nullptr ? root : ".") +
                               "/examples/fashion_mnist_mlp.job.json",
                           &spec)
                  .ok());
  // One update per 16-sample micro-batch: a smaller step than the job's.
  spec.mutable_optimizer()->mutable_sgd()->set_lr(0.005f);
  Pipeline p = BuildPipeline(spec, {2, 4}, v1::SCHEDULE_ASYNC_1F1B);
  auto backend = CreateCpuBackend(1);
  auto reference = LocalTrainer::Create(spec, backend.get());
  ASSERT_TRUE(reference.ok());
  const int64_t steps = (*reference)->total_steps();
  for (auto& stage : p.stages) ASSERT_TRUE(stage->Train(steps).ok());
  for (auto& stage : p.stages) ASSERT_TRUE(stage->Wait().ok()) << stage->Wait();
  std::vector<Tensor> weights;
  for (auto& stage : p.stages) {
    auto w = stage->Weights();
    ASSERT_TRUE(w.ok());
    for (const auto& t : w->weights()) {
      Tensor host = Tensor::Host({t.shape().begin(), t.shape().end()});
      std::memcpy(host.raw(), t.data().data(), t.data().size());
      weights.push_back(host);
    }
  }
  ASSERT_TRUE((*reference)->model()->LoadParams(weights).ok());
  auto eval = (*reference)->Evaluate();
  ASSERT_TRUE(eval.ok());
  std::printf("async 1F1B fashion-mnist test accuracy %.4f\n", eval->accuracy);
  EXPECT_GE(eval->accuracy, 0.85);
}

// PipeDream-2BW trains the Fashion-MNIST MLP (3 stages) to >= 85%: one
// update per 64-sample mini-batch, one step stale.
TEST(StageExecutor, TwoBWLearnsFashionMnist) {
  v1::TrainingSpec spec;
  const char* root = std::getenv("PIPETRAIN_SOURCE_DIR");
  ASSERT_TRUE(ReadJsonFile(std::string(root != nullptr ? root : ".") +
                               "/examples/fashion_mnist_mlp.job.json",
                           &spec)
                  .ok());
  spec.mutable_optimizer()->mutable_sgd()->set_lr(kTwoBWLearningRate);
  Pipeline p = BuildPipeline(spec, {2, 4}, v1::SCHEDULE_2BW);
  auto backend = CreateCpuBackend(1);
  auto reference = LocalTrainer::Create(spec, backend.get());
  ASSERT_TRUE(reference.ok());
  const int64_t steps = (*reference)->total_steps();
  for (auto& stage : p.stages) ASSERT_TRUE(stage->Train(steps).ok());
  for (auto& stage : p.stages) ASSERT_TRUE(stage->Wait().ok()) << stage->Wait();
  std::vector<Tensor> weights;
  for (auto& stage : p.stages) {
    auto w = stage->Weights();
    ASSERT_TRUE(w.ok());
    EXPECT_EQ(w->weight_version(), steps);
    for (const auto& t : w->weights()) {
      Tensor host = Tensor::Host({t.shape().begin(), t.shape().end()});
      std::memcpy(host.raw(), t.data().data(), t.data().size());
      weights.push_back(host);
    }
  }
  ASSERT_TRUE((*reference)->model()->LoadParams(weights).ok());
  auto eval = (*reference)->Evaluate();
  ASSERT_TRUE(eval.ok());
  std::printf("2BW fashion-mnist test accuracy %.4f\n", eval->accuracy);
  EXPECT_GE(eval->accuracy, 0.85);
}

}  // namespace
}  // namespace pipetrain
