// K stage executors connected in memory (no transport) must train exactly
// like the in-process reference trainer.
#include "worker/pipeline/stage_executor.h"

#include <chrono>
#include <cmath>
#include <thread>

#include "gtest/gtest.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/pipeline/local_trainer.h"

namespace pipetrain {
namespace {

// Delivers straight into a neighbour's mailbox, after the same validation
// the network edge does. Copies tensors so no storage is shared.
class InMemoryLink : public StageLink {
 public:
  explicit InMemoryLink(StageExecutor* to) : to_(to) {}
  absl::Status Send(StageMessage message) override {
    for (Tensor& t : message.tensors) {
      Tensor copy = Tensor::Host(t.shape(), t.dtype());
      std::memcpy(copy.raw(), t.raw(), t.bytes());
      t = copy;
    }
    absl::Status valid = to_->ValidateIncoming(message);
    if (!valid.ok()) return valid;
    return to_->mailbox()->Deliver(std::move(message));
  }

 private:
  StageExecutor* const to_;
};

v1::TrainingSpec Spec(int64_t m, bool remat) {
  v1::TrainingSpec spec;
  const absl::Status status = ParseJson(R"({
    "model": {
      "inputKind": "INPUT_KIND_FLOAT", "inputShape": [12],
      "loss": "LOSS_KIND_SOFTMAX_CROSS_ENTROPY",
      "layers": [
        {"linear": {"inFeatures": 12, "outFeatures": 32}},
        {"gelu": {}},
        {"dropout": {"rate": 0.1}},
        {"layerNorm": {"features": 32}},
        {"linear": {"inFeatures": 32, "outFeatures": 16}},
        {"relu": {}},
        {"linear": {"inFeatures": 16, "outFeatures": 4}}
      ]},
    "data": {"synthetic": {"features": 12, "classes": 4,
                           "trainSamples": 1024, "evalSamples": 64}},
    "optimizer": {"sgd": {"lr": 0.1, "momentum": 0.9}, "clipGradNorm": 0.5},
    "batchSize": 32, "steps": 6, "seed": 11})",
                                        &spec);
  EXPECT_TRUE(status.ok()) << status;
  spec.set_micro_batches(m);
  spec.set_rematerialize(remat);
  return spec;
}

struct Pipeline {
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::unique_ptr<StageExecutor>> stages;
  
};

// Cuts the model at `cuts` (layer indices) into stages.
Pipeline Build(const v1::TrainingSpec& spec, const std::vector<int>& cuts) {
  Pipeline p;
  std::vector<int> bounds = {0};
  bounds.insert(bounds.end(), cuts.begin(), cuts.end());
  bounds.push_back(spec.model().layers_size());
  const int k = static_cast<int>(bounds.size()) - 1;
  for (int s = 0; s < k; ++s) {
    v1::StageConfig config;
    config.set_job_id("job");
    *config.mutable_spec() = spec;
    config.set_stage(s);
    config.set_num_stages(k);
    config.set_layer_begin(bounds[s]);
    config.set_layer_end(bounds[s + 1]);
    if (s + 1 < k) config.set_downstream("in-memory");
    config.set_recv_timeout_s(30);
    p.backends.push_back(CreateCpuBackend(1));
    auto stage = StageExecutor::Create(config, p.backends.back().get());
    EXPECT_TRUE(stage.ok()) << stage.status();
    p.stages.push_back(std::move(*stage));
  }
  for (int s = 0; s + 1 < k; ++s) {
    p.stages[s]->SetDownstream(
        std::make_shared<InMemoryLink>(p.stages[s + 1].get()));
    p.stages[s + 1]->SetUpstream(
        std::make_shared<InMemoryLink>(p.stages[s].get()));
  }
  return p;
}

void ExpectMatchesReference(const v1::TrainingSpec& spec,
                            const std::vector<int>& cuts) {
  auto backend = CreateCpuBackend(1);
  auto reference = LocalTrainer::Create(spec, backend.get());
  ASSERT_TRUE(reference.ok()) << reference.status();
  std::vector<double> want_losses;
  for (int i = 0; i < spec.steps(); ++i) {
    auto r = (*reference)->Step();
    ASSERT_TRUE(r.ok());
    want_losses.push_back(r->loss);
  }
  auto want_weights = (*reference)->model()->ParamsToHost();
  ASSERT_TRUE(want_weights.ok());

  Pipeline p = Build(spec, cuts);
  for (auto& stage : p.stages) ASSERT_TRUE(stage->Train(spec.steps()).ok());
  for (auto& stage : p.stages) ASSERT_TRUE(stage->Wait().ok()) << stage->Wait();
  const auto status = p.stages.back()->GetStatus(0);
  ASSERT_EQ(status.results_size(), spec.steps());
  for (int i = 0; i < spec.steps(); ++i) {
    EXPECT_NEAR(status.results(i).loss(), want_losses[i],
                1e-5 * want_losses[i])
        << "step " << i;
  }
  size_t w = 0;
  for (auto& stage : p.stages) {
    auto weights = stage->Weights();
    ASSERT_TRUE(weights.ok());
    EXPECT_EQ(weights->weight_version(), spec.steps());
    for (const auto& t : weights->weights()) {
      ASSERT_LT(w, want_weights->size());
      const std::vector<float> want = (*want_weights)[w++].ToVector();
      ASSERT_EQ(t.data().size(), want.size() * sizeof(float)) << t.name();
      const float* got = reinterpret_cast<const float*>(t.data().data());
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], 1e-5 * std::max(1.0f, std::fabs(want[i])))
            << t.name() << "[" << i << "]";
      }
    }
  }
  EXPECT_EQ(w, want_weights->size());
}

TEST(StageExecutor, OneStageMatchesTheReference) {
  ExpectMatchesReference(Spec(4, false), {});
}

TEST(StageExecutor, TwoToFourStagesMatchTheReference) {
  for (bool remat : {false, true}) {
    for (int64_t m : {4, 8}) {
      SCOPED_TRACE(::testing::Message() << "M=" << m << " remat=" << remat);
      ExpectMatchesReference(Spec(m, remat), {3});
      ExpectMatchesReference(Spec(m, remat), {2, 5});
      ExpectMatchesReference(Spec(m, remat), {1, 3, 6});
    }
  }
}

TEST(StageExecutor, RematerializationHoldsLessActivationMemory) {
  int64_t peak[2];
  for (bool remat : {false, true}) {
    Pipeline p = Build(Spec(8, remat), {3});
    for (auto& stage : p.stages) ASSERT_TRUE(stage->Train(1).ok());
    for (auto& stage : p.stages) ASSERT_TRUE(stage->Wait().ok());
    peak[remat] = p.stages[0]->timings().peak_activation_bytes;
  }
  EXPECT_GT(peak[0], 0);
  EXPECT_LT(peak[1], peak[0]);
}

TEST(StageExecutor, BadConfigsAndMessagesAreRejected) {
  v1::StageConfig config;
  config.set_job_id("job");
  *config.mutable_spec() = Spec(4, false);
  config.set_num_stages(2);
  config.set_stage(2);
  config.set_layer_begin(0);
  config.set_layer_end(3);
  auto backend = CreateCpuBackend(1);
  EXPECT_EQ(StageExecutor::Create(config, backend.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  config.set_stage(1);
  config.set_layer_end(9);
  EXPECT_EQ(StageExecutor::Create(config, backend.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  config.set_layer_begin(3);
  config.set_layer_end(7);
  auto stage = StageExecutor::Create(config, backend.get());
  ASSERT_TRUE(stage.ok()) << stage.status();

  StageMessage good;
  good.kind = MessageKind::kActivation;
  good.tensors = {Tensor::Host({8, 32}), Tensor::Host({8})};
  EXPECT_TRUE((*stage)->ValidateIncoming(good).ok())
      << (*stage)->ValidateIncoming(good);
  StageMessage bad = good;
  bad.tensors[0] = Tensor::Host({8, 31});
  EXPECT_EQ((*stage)->ValidateIncoming(bad).code(),
            absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.tensors[0] = Tensor::Host({8, 32}, DType::kBF16);
  EXPECT_EQ((*stage)->ValidateIncoming(bad).code(),
            absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.micro_batch = 4;
  EXPECT_EQ((*stage)->ValidateIncoming(bad).code(),
            absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.step = 5;
  EXPECT_EQ((*stage)->ValidateIncoming(bad).code(),
            absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.kind = MessageKind::kGradient;
  EXPECT_EQ((*stage)->ValidateIncoming(bad).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(StageExecutor, AMissingNeighbourFailsTheStepInBoundedTime) {
  v1::TrainingSpec spec = Spec(4, false);
  Pipeline p = Build(spec, {3});
  // Only the last stage trains: its first receive times out.
  v1::StageConfig config = p.stages[1]->config();
  config.set_recv_timeout_s(0.2);
  auto backend = CreateCpuBackend(1);
  auto lonely = StageExecutor::Create(config, backend.get());
  ASSERT_TRUE(lonely.ok());
  ASSERT_TRUE((*lonely)->Train(1).ok());
  const absl::Status status = (*lonely)->Wait();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_EQ((*lonely)->GetStatus(0).state(), v1::STAGE_STATE_FAILED);
  // A failed mailbox (broken stream) wakes the waiter at once.
  auto again = StageExecutor::Create(p.stages[1]->config(), backend.get());
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE((*again)->Train(1).ok());
  (*again)->mailbox()->Fail(absl::UnavailableError("upstream went away"));
  EXPECT_EQ((*again)->Wait().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace pipetrain

namespace pipetrain {
namespace {

// Pausing: lower stage 0's target first, then give the others the target
// it reports; every stage stops at the same step and resumes from it.
TEST(StageExecutor, TargetsMoveWhileTrainingToPauseAndResume) {
  v1::TrainingSpec spec = Spec(4, false);
  spec.set_steps(100000);
  Pipeline p = Build(spec, {3});
  for (auto& stage : p.stages) ASSERT_TRUE(stage->Train(spec.steps()).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto target = p.stages[0]->Train(0);
  ASSERT_TRUE(target.ok());
  EXPECT_GT(*target, 0);
  EXPECT_TRUE(p.stages[1]->Train(*target).ok());
  for (auto& stage : p.stages) ASSERT_TRUE(stage->Wait().ok());
  for (auto& stage : p.stages) {
    EXPECT_EQ(stage->next_step(), *target);
    EXPECT_EQ(stage->GetStatus(0).state(), v1::STAGE_STATE_DONE);
  }
  for (auto& stage : p.stages) ASSERT_TRUE(stage->Train(*target + 3).ok());
  for (auto& stage : p.stages) ASSERT_TRUE(stage->Wait().ok());
  EXPECT_EQ(p.stages[1]->next_step(), *target + 3);
  EXPECT_EQ(p.stages[1]->GetStatus(0).results_size(), *target + 3);
}

}  // namespace
}  // namespace pipetrain
