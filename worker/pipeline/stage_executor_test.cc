// K stage executors connected in memory (no transport) must train exactly
// like the in-process reference trainer.
#include "worker/pipeline/stage_executor.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "common/proto_json.h"
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
Pipeline Build(const v1::TrainingSpec& spec, const std::vector<int>& cuts,
               v1::ScheduleKindProto schedule = v1::SCHEDULE_GPIPE,
               bool vertical_sync = false) {
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
    config.set_schedule(schedule);
    config.set_vertical_sync(vertical_sync);
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

void ExpectMatchesReference(
    const v1::TrainingSpec& spec, const std::vector<int>& cuts,
    v1::ScheduleKindProto schedule = v1::SCHEDULE_GPIPE) {
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

  Pipeline p = Build(spec, cuts, schedule);
  for (auto& stage : p.stages) ASSERT_TRUE(stage->Train(spec.steps()).ok());
  for (auto& stage : p.stages) ASSERT_TRUE(stage->Wait().ok()) << stage->Wait();
  const auto status = p.stages.back()->GetStatus(0);
  ASSERT_EQ(status.results_size(), spec.steps());
  for (int i = 0; i < spec.steps(); ++i) {
    EXPECT_NEAR(status.results(i).loss(), want_losses[i], 1e-5 * want_losses[i])
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

// 1F1B-flush and ZB-H1 are synchronous too: with backwards (and ZB-H1's W
// passes) in ascending micro-batch order they accumulate gradients in the
// reference's order.
TEST(StageExecutor, OneFOneBAndZeroBubbleMatchTheReference) {
  for (v1::ScheduleKindProto schedule :
       {v1::SCHEDULE_1F1B_FLUSH, v1::SCHEDULE_ZB_H1}) {
    for (bool remat : {false, true}) {
      for (int64_t m : {4, 8}) {
        SCOPED_TRACE(::testing::Message()
                     << v1::ScheduleKindProto_Name(schedule) << " M=" << m
                     << " remat=" << remat);
        ExpectMatchesReference(Spec(m, remat), {3}, schedule);
        ExpectMatchesReference(Spec(m, remat), {2, 5}, schedule);
        ExpectMatchesReference(Spec(m, remat), {1, 3, 6}, schedule);
      }
    }
  }
}

// A small character-level Transformer: embedding (whose gradient ZB-H1
// computes in W), attention and layer norms, cut inside the block stack.
TEST(StageExecutor, ZeroBubbleTrainsATransformerLikeTheReference) {
  const std::string corpus = ::testing::TempDir() + "/zb_corpus.txt";
  {
    std::ofstream out(corpus);
    for (int i = 0; i < 200; ++i) {
      out << "the quick brown fox " << i << " jumps over the lazy dog.\n";
    }
  }
  v1::TrainingSpec spec;
  const absl::Status status = ParseJson(R"({
    "model": {
      "inputKind": "INPUT_KIND_TOKENS", "inputShape": [8],
      "loss": "LOSS_KIND_SOFTMAX_CROSS_ENTROPY",
      "layers": [
        {"embedding": {"vocabSize": 256, "dim": 16, "maxSeqLen": 8}},
        {"transformerBlock": {"dim": 16, "heads": 2}},
        {"transformerBlock": {"dim": 16, "heads": 2, "mlpDim": 32}},
        {"layerNorm": {"features": 16}},
        {"linear": {"inFeatures": 16, "outFeatures": 256}}
      ]},
    "data": {"charCorpus": {"seqLen": 8}},
    "optimizer": {"adamw": {"lr": 0.003, "weightDecay": 0.01},
                  "clipGradNorm": 1.0},
    "batchSize": 16, "microBatches": 4, "steps": 4, "seed": 1})",
                                        &spec);
  ASSERT_TRUE(status.ok()) << status;
  spec.mutable_data()->mutable_char_corpus()->add_files(corpus);
  for (bool remat : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "remat=" << remat);
    spec.set_rematerialize(remat);
    ExpectMatchesReference(spec, {2}, v1::SCHEDULE_ZB_H1);
    ExpectMatchesReference(spec, {1, 3}, v1::SCHEDULE_ZB_H1);
  }
}

// Interleaved 1F1B: the model is cut at `cuts` into K * v virtual stages;
// worker s holds chunks c = 0..v-1, virtual stage c * K + s. Each worker's
// downstream is the next worker (the last one's wraps to worker 0), its
// upstream the previous one (worker 0's is the last); K = 1 links to itself.
Pipeline BuildInterleaved(const v1::TrainingSpec& spec, int k, int v,
                          const std::vector<int>& cuts,
                          bool with_links = true) {
  Pipeline p;
  std::vector<int> bounds = {0};
  bounds.insert(bounds.end(), cuts.begin(), cuts.end());
  bounds.push_back(spec.model().layers_size());
  EXPECT_EQ(static_cast<int>(bounds.size()) - 1, k * v);
  for (int s = 0; s < k; ++s) {
    v1::StageConfig config;
    config.set_job_id("job");
    *config.mutable_spec() = spec;
    config.set_stage(s);
    config.set_num_stages(k);
    config.set_schedule(v1::SCHEDULE_INTERLEAVED);
    config.set_virtual_stages(v);
    for (int c = 0; c < v; ++c) {
      v1::LayerRange* range = config.add_chunks();
      range->set_begin(bounds[c * k + s]);
      range->set_end(bounds[c * k + s + 1]);
    }
    config.set_downstream("in-memory");
    config.set_recv_timeout_s(30);
    p.backends.push_back(CreateCpuBackend(1));
    auto stage = StageExecutor::Create(config, p.backends.back().get());
    EXPECT_TRUE(stage.ok()) << stage.status();
    if (!stage.ok()) return p;
    p.stages.push_back(std::move(*stage));
  }
  if (!with_links) return p;
  for (int s = 0; s < k; ++s) {
    StageExecutor* next = p.stages[(s + 1) % k].get();
    p.stages[s]->SetDownstream(std::make_shared<InMemoryLink>(next));
    next->SetUpstream(std::make_shared<InMemoryLink>(p.stages[s].get()));
  }
  return p;
}

void ExpectInterleavedMatchesReference(const v1::TrainingSpec& spec, int k,
                                       int v, const std::vector<int>& cuts) {
  auto backend = CreateCpuBackend(1);
  auto reference = LocalTrainer::Create(spec, backend.get());
  ASSERT_TRUE(reference.ok()) << reference.status();
  std::vector<double> want_losses;
  for (int i = 0; i < spec.steps(); ++i) {
    auto r = (*reference)->Step();
    ASSERT_TRUE(r.ok());
    want_losses.push_back(r->loss);
  }
  auto want_host = (*reference)->model()->ParamsToHost();
  ASSERT_TRUE(want_host.ok());
  std::map<std::string, std::vector<float>> want_weights;
  for (size_t i = 0; i < want_host->size(); ++i) {
    want_weights[(*reference)->model()->params()[i]->name] =
        (*want_host)[i].ToVector();
  }

  Pipeline p = BuildInterleaved(spec, k, v, cuts);
  ASSERT_EQ(static_cast<int>(p.stages.size()), k);
  for (auto& stage : p.stages) ASSERT_TRUE(stage->Train(spec.steps()).ok());
  for (auto& stage : p.stages) ASSERT_TRUE(stage->Wait().ok()) << stage->Wait();
  const auto status = p.stages.back()->GetStatus(0);
  ASSERT_EQ(status.results_size(), spec.steps());
  for (int i = 0; i < spec.steps(); ++i) {
    EXPECT_NEAR(status.results(i).loss(), want_losses[i], 1e-5 * want_losses[i])
        << "step " << i;
  }
  size_t seen = 0;
  for (auto& stage : p.stages) {
    auto weights = stage->Weights();
    ASSERT_TRUE(weights.ok());
    EXPECT_EQ(weights->weight_version(), spec.steps());
    for (const auto& t : weights->weights()) {
      auto it = want_weights.find(t.name());
      ASSERT_NE(it, want_weights.end()) << t.name();
      ++seen;
      const std::vector<float>& want = it->second;
      ASSERT_EQ(t.data().size(), want.size() * sizeof(float)) << t.name();
      const float* got = reinterpret_cast<const float*>(t.data().data());
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], 1e-5 * std::max(1.0f, std::fabs(want[i])))
            << t.name() << "[" << i << "]";
      }
    }
  }
  EXPECT_EQ(seen, want_weights.size());
}

// The spec's 7 layers cut into K * v chunks: virtual stage j = c * K + s.
TEST(StageExecutor, InterleavedMatchesTheReference) {
  for (bool remat : {false, true}) {
    for (int64_t m : {4, 8}) {
      SCOPED_TRACE(::testing::Message() << "M=" << m << " remat=" << remat);
      ExpectInterleavedMatchesReference(Spec(m, remat), 1, 2, {3});
      ExpectInterleavedMatchesReference(Spec(m, remat), 2, 2, {2, 4, 5});
      ExpectInterleavedMatchesReference(Spec(m, remat), 2, 3, {1, 2, 3, 4, 5});
    }
    // K = 3 needs M divisible by 3: 48 samples in 3 or 6 micro-batches.
    for (int64_t m : {3, 6}) {
      SCOPED_TRACE(::testing::Message() << "K=3 M=" << m << " remat=" << remat);
      v1::TrainingSpec spec = Spec(m, remat);
      spec.set_batch_size(48);
      ExpectInterleavedMatchesReference(spec, 3, 2, {1, 2, 3, 4, 5});
    }
  }
}

TEST(StageExecutor, InterleavedConfigsAndMessagesAreChecked) {
  Pipeline p = BuildInterleaved(Spec(4, false), 2, 2, {2, 4, 5},
                                /*with_links=*/false);
  ASSERT_EQ(p.stages.size(), 2u);
  // Worker 1 (chunks [2, 4) and [5, 7)) must have its wrap-around link.
  EXPECT_EQ(p.stages[1]->Train(1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  v1::StageConfig config = p.stages[1]->config();
  auto backend = CreateCpuBackend(1);
  config.clear_downstream();
  EXPECT_EQ(StageExecutor::Create(config, backend.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  config = p.stages[1]->config();
  config.set_virtual_stages(3);
  EXPECT_EQ(StageExecutor::Create(config, backend.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  config = p.stages[1]->config();
  config.mutable_chunks(1)->set_end(5);  // empty
  EXPECT_EQ(StageExecutor::Create(config, backend.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  config = p.stages[0]->config();
  config.set_schedule(v1::SCHEDULE_1F1B_FLUSH);
  EXPECT_EQ(StageExecutor::Create(config, backend.get()).status().code(),
            absl::StatusCode::kInvalidArgument);

  // Worker 0's chunk 1 ([4, 5), after layer norm) takes [8, 32] activations
  // from worker 1's chunk 0; its chunk 0 takes none.
  StageMessage good;
  good.kind = MessageKind::kActivation;
  good.chunk = 1;
  good.tensors = {Tensor::Host({8, 32}), Tensor::Host({8})};
  EXPECT_TRUE(p.stages[0]->ValidateIncoming(good).ok())
      << p.stages[0]->ValidateIncoming(good);
  StageMessage bad = good;
  bad.chunk = 0;
  EXPECT_EQ(p.stages[0]->ValidateIncoming(bad).code(),
            absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.chunk = 2;
  EXPECT_EQ(p.stages[0]->ValidateIncoming(bad).code(),
            absl::StatusCode::kInvalidArgument);
  // Worker 1's chunk 0 ([2, 4)) takes the gradient of its [8, 32] output;
  // its chunk 1 (the loss) takes none.
  StageMessage grad;
  grad.kind = MessageKind::kGradient;
  grad.chunk = 0;
  grad.tensors = {Tensor::Host({8, 32})};
  EXPECT_TRUE(p.stages[1]->ValidateIncoming(grad).ok())
      << p.stages[1]->ValidateIncoming(grad);
  grad.chunk = 1;
  grad.tensors = {Tensor::Host({8, 4})};
  EXPECT_EQ(p.stages[1]->ValidateIncoming(grad).code(),
            absl::StatusCode::kInvalidArgument);
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
  config.set_schedule(v1::SCHEDULE_INTERLEAVED);
  EXPECT_EQ(StageExecutor::Create(config, backend.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  config.set_schedule(v1::SCHEDULE_GPIPE);
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

namespace pipetrain {
namespace {

ScheduleKind KindOf(v1::ScheduleKindProto schedule) {
  switch (schedule) {
    case v1::SCHEDULE_1F1B_FLUSH:
      return ScheduleKind::kOneFOneBFlush;
    case v1::SCHEDULE_ZB_H1:
      return ScheduleKind::kZeroBubbleH1;
    default:
      return ScheduleKind::kGPipe;
  }
}

// After N steps every stage's trace holds, per step, exactly its schedule's
// instructions in order: so one forward and one backward (or one B and one
// W) per micro-batch, each with the step's weight version.
TEST(StageExecutor, TraceRecordsEveryInstructionInScheduleOrder) {
  constexpr int kSteps = 3;
  constexpr int kMicroBatches = 4;
  for (v1::ScheduleKindProto schedule :
       {v1::SCHEDULE_GPIPE, v1::SCHEDULE_1F1B_FLUSH, v1::SCHEDULE_ZB_H1}) {
    SCOPED_TRACE(v1::ScheduleKindProto_Name(schedule));
    const bool zb = schedule == v1::SCHEDULE_ZB_H1;
    v1::TrainingSpec spec = Spec(kMicroBatches, false);
    spec.set_steps(kSteps);
    Pipeline p = Build(spec, {2, 5}, schedule);
    for (auto& stage : p.stages) ASSERT_TRUE(stage->Train(kSteps).ok());
    for (auto& stage : p.stages) ASSERT_TRUE(stage->Wait().ok());
    const int k = static_cast<int>(p.stages.size());
    for (int s = 0; s < k; ++s) {
      SCOPED_TRACE(::testing::Message() << "stage " << s);
      ScheduleParams params;
      params.kind = KindOf(schedule);
      params.num_stages = k;
      params.micro_batches = kMicroBatches;
      auto want = BuildSchedule(params, s);
      ASSERT_TRUE(want.ok());
      const v1::GetTraceResponse trace = p.stages[s]->Trace(0);
      ASSERT_EQ(trace.events_size(), kSteps * static_cast<int>(want->size()));
      int e = 0;
      for (int step = 0; step < kSteps; ++step) {
        std::map<std::string, std::vector<int>> per_op;  // op -> count per mb
        for (const Instruction& instruction : *want) {
          const v1::TraceEvent& event = trace.events(e++);
          EXPECT_EQ(event.stage(), s);
          EXPECT_EQ(event.step(), step);
          EXPECT_EQ(event.op(), OpKindShortName(instruction.op));
          EXPECT_EQ(event.micro_batch(), instruction.micro_batch);
          EXPECT_EQ(event.chunk(), 0);
          EXPECT_EQ(event.weight_version(), step);
          EXPECT_LE(event.start_unix_us(), event.end_unix_us());
          std::vector<int>& count = per_op[event.op()];
          count.resize(kMicroBatches);
          ++count.at(event.micro_batch());
        }
        const std::vector<int> once(kMicroBatches, 1);
        EXPECT_EQ(per_op["F"], once);
        EXPECT_EQ(per_op[zb ? "BI" : "B"], once);
        EXPECT_EQ(per_op["W"], zb ? once : std::vector<int>());
        EXPECT_EQ(per_op.count(zb ? "B" : "BI"), 0u);
      }
      // since_step keeps only the later steps.
      const v1::GetTraceResponse late = p.stages[s]->Trace(kSteps - 1);
      ASSERT_EQ(late.events_size(), static_cast<int>(want->size()));
      for (const v1::TraceEvent& event : late.events()) {
        EXPECT_EQ(event.step(), kSteps - 1);
      }
      EXPECT_EQ(p.stages[s]->Trace(kSteps).events_size(), 0);
    }
  }
}

// ZB-H1 frees a micro-batch's activations after W, so its peak is no lower
// than 1F1B-flush's, and no higher than GPipe's (which holds all M).
TEST(StageExecutor, ZeroBubbleActivationMemoryLiesBetween1F1BAndGPipe) {
  std::map<v1::ScheduleKindProto, int64_t> peak;
  for (v1::ScheduleKindProto schedule :
       {v1::SCHEDULE_GPIPE, v1::SCHEDULE_1F1B_FLUSH, v1::SCHEDULE_ZB_H1}) {
    Pipeline p = Build(Spec(8, false), {2, 5}, schedule);
    for (auto& stage : p.stages) ASSERT_TRUE(stage->Train(1).ok());
    for (auto& stage : p.stages) ASSERT_TRUE(stage->Wait().ok());
    peak[schedule] = p.stages[1]->timings().peak_activation_bytes;
  }
  EXPECT_GT(peak[v1::SCHEDULE_1F1B_FLUSH], 0);
  EXPECT_LT(peak[v1::SCHEDULE_1F1B_FLUSH], peak[v1::SCHEDULE_GPIPE]);
  EXPECT_GE(peak[v1::SCHEDULE_ZB_H1], peak[v1::SCHEDULE_1F1B_FLUSH]);
  EXPECT_LT(peak[v1::SCHEDULE_ZB_H1], peak[v1::SCHEDULE_GPIPE]);
}

}  // namespace
}  // namespace pipetrain

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

// 2BW's Fashion-MNIST learning rate (SGD, momentum 0.9 from the job): the
// one-step-stale gradients diverge at 0.1, reach ~83% at the job's 0.05 and
// ~86.7% at 0.02 within the job's epochs.
constexpr float kTwoBWLearningRate = 0.02f;

v1::TrainingSpec AsyncSpec() {
  v1::TrainingSpec spec = Spec(8, false);
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
    Pipeline p = Build(spec, cuts, v1::SCHEDULE_ASYNC_1F1B);
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
    Pipeline p = Build(spec, {2, 5}, schedule);
    for (auto& stage : p.stages) ASSERT_TRUE(stage->Train(spec.steps()).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
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

// PipeDream-2BW: one update per step, right after its last backward; every
// micro-batch of step t runs forward and backward with version
// max(0, t - 1) (the version after step t - 2's update: W(t+1) = W(t) -
// lr grad(W(t-1))) on every stage, so at most two versions are live (one
// stashed copy), and the steps overlap.
TEST(StageExecutor, TwoBWDoubleBuffersTheWeights) {
  v1::TrainingSpec spec = AsyncSpec();
  spec.set_steps(5);
  Pipeline p = Build(spec, {2, 5}, v1::SCHEDULE_2BW);
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

TEST(StageExecutor, VerticalSyncUsesStageZerosVersionEverywhere) {
  const v1::TrainingSpec spec = AsyncSpec();
  Pipeline p = Build(spec, {2, 5}, v1::SCHEDULE_ASYNC_1F1B, true);
  for (auto& stage : p.stages) ASSERT_TRUE(stage->Train(spec.steps()).ok());
  for (auto& stage : p.stages) ASSERT_TRUE(stage->Wait().ok()) << stage->Wait();
  const auto first = VersionsOf(p.stages[0]->Trace(0), "F");
  ASSERT_EQ(first.size(), static_cast<size_t>(spec.steps() * 8));
  for (size_t s = 1; s < p.stages.size(); ++s) {
    const v1::GetTraceResponse trace = p.stages[s]->Trace(0);
    EXPECT_EQ(VersionsOf(trace, "F"), first) << "stage " << s;
    EXPECT_EQ(VersionsOf(trace, "B"), first) << "stage " << s;
  }
}

TEST(StageExecutor, AsyncRejectsGlobalClippingAndStrayVerticalSync) {
  v1::StageConfig config;
  config.set_job_id("job");
  *config.mutable_spec() = Spec(4, false);  // clips the gradient norm
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
  Pipeline p = Build(spec, {2, 4}, v1::SCHEDULE_ASYNC_1F1B);
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
  Pipeline p = Build(spec, {2, 4}, v1::SCHEDULE_2BW);
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
