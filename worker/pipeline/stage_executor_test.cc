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

#include "absl/strings/str_cat.h"
#include "common/proto_json.h"
#include "gtest/gtest.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/pipeline/in_memory_pipeline.h"
#include "worker/pipeline/local_trainer.h"

namespace pipetrain {
namespace {

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

  Pipeline p = BuildPipeline(spec, cuts, schedule);
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
  ExpectMatchesReference(SmallMlpSpec(4, false), {});
}

TEST(StageExecutor, TwoToFourStagesMatchTheReference) {
  for (bool remat : {false, true}) {
    for (int64_t m : {4, 8}) {
      SCOPED_TRACE(::testing::Message() << "M=" << m << " remat=" << remat);
      ExpectMatchesReference(SmallMlpSpec(m, remat), {3});
      ExpectMatchesReference(SmallMlpSpec(m, remat), {2, 5});
      ExpectMatchesReference(SmallMlpSpec(m, remat), {1, 3, 6});
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
        ExpectMatchesReference(SmallMlpSpec(m, remat), {3}, schedule);
        ExpectMatchesReference(SmallMlpSpec(m, remat), {2, 5}, schedule);
        ExpectMatchesReference(SmallMlpSpec(m, remat), {1, 3, 6}, schedule);
      }
    }
  }
}

// Delivers like InMemoryLink, but holds back the gradient of one
// micro-batch for `delay` first, as a slow neighbour would.
class SlowGradientLink : public StageLink {
 public:
  SlowGradientLink(StageExecutor* to, int32_t micro_batch,
                   std::chrono::milliseconds delay)
      : inner_(to), micro_batch_(micro_batch), delay_(delay) {}
  absl::Status Send(StageMessage message) override {
    if (message.kind == MessageKind::kGradient &&
        message.micro_batch == micro_batch_) {
      std::this_thread::sleep_for(delay_);
    }
    return inner_.Send(std::move(message));
  }

 private:
  InMemoryLink inner_;
  const int32_t micro_batch_;
  const std::chrono::milliseconds delay_;
};

// In a drain (every forward of the step run), stage 0 waits for the last
// micro-batch's gradient, held back here by 30 ms; in that wait it runs the
// weight-gradient products it holds ahead of its update, where its backend
// resumes sums exactly (layers 256 wide on a CPU with AVX-512), and the
// trace shows them in that receive. The weights still come out bit for bit
// as the in-process trainer's, under every synchronous schedule.
TEST(StageExecutor, HeldWeightProductsRunInADrainsWaitWithTheSameBits) {
  v1::TrainingSpec spec;
  ASSERT_TRUE(ParseJson(R"({
    "model": {
      "inputKind": "INPUT_KIND_FLOAT", "inputShape": [256],
      "loss": "LOSS_KIND_SOFTMAX_CROSS_ENTROPY",
      "layers": [
        {"linear": {"inFeatures": 256, "outFeatures": 256}},
        {"relu": {}},
        {"linear": {"inFeatures": 256, "outFeatures": 256}},
        {"relu": {}},
        {"linear": {"inFeatures": 256, "outFeatures": 4}}
      ]},
    "data": {"synthetic": {"features": 256, "classes": 4,
                           "trainSamples": 1024, "evalSamples": 64}},
    "optimizer": {"sgd": {"lr": 0.05, "momentum": 0.9}},
    "batchSize": 256, "microBatches": 8, "steps": 3, "seed": 5})",
                        &spec)
                  .ok());
  auto backend = CreateCpuBackend(1);
  const bool resumes = backend->ResumesSums(true, false, 256, 256, 256);
  auto reference = LocalTrainer::Create(spec, backend.get());
  ASSERT_TRUE(reference.ok()) << reference.status();
  for (int i = 0; i < spec.steps(); ++i) ASSERT_TRUE((*reference)->Step().ok());
  auto want = (*reference)->model()->ParamsToHost();
  ASSERT_TRUE(want.ok());
  for (v1::ScheduleKindProto schedule :
       {v1::SCHEDULE_GPIPE, v1::SCHEDULE_1F1B_FLUSH, v1::SCHEDULE_ZB_H1}) {
    SCOPED_TRACE(v1::ScheduleKindProto_Name(schedule));
    Pipeline p = BuildPipeline(spec, {2}, schedule);
    ASSERT_EQ(p.stages.size(), 2u);
    p.stages[1]->SetUpstream(std::make_shared<SlowGradientLink>(
        p.stages[0].get(), 7, std::chrono::milliseconds(30)));
    ASSERT_TRUE(TrainAll(p, spec.steps()).ok());
    const std::vector<Tensor> got = WeightsInOrder(p);
    ASSERT_EQ(got.size(), want->size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].ToVector(), (*want)[i].ToVector()) << "parameter " << i;
    }
    // Stage 0 holds the rows of its 256 x 256 layer (256 + 256 floats a
    // row; 32 rows a micro-batch): every step they all run once, some in
    // its receives (on a CPU that resumes sums: at the latest in the wait
    // for the held-back gradient, with 224 rows held), the rest at its
    // update.
    std::map<int64_t, int64_t> in_receives, in_all;
    const v1::GetTraceResponse trace = p.stages[0]->Trace(0);
    for (const v1::TraceEvent& e : trace.events()) {
      in_all[e.step()] += e.weight_grad_bytes_run();
      if (e.op() == "RecvG") in_receives[e.step()] += e.weight_grad_bytes_run();
    }
    for (int64_t step = 0; step < spec.steps(); ++step) {
      SCOPED_TRACE(::testing::Message() << "step " << step);
      EXPECT_EQ(in_all[step], 8 * 32 * 512 * 4);
      if (resumes) {
        EXPECT_GT(in_receives[step], 0);
      } else {
        EXPECT_EQ(in_receives[step], 0);
      }
    }
  }
}

// Where a stage's time went, as its metrics say: a zero-bubble schedule's
// weight-gradient pass W is its own phase; so are the weight-gradient
// products a synchronous stage holds over a step's micro-batches and runs
// before its update (Model::DeferWeightGrads); with one micro-batch a step
// they run in the full backward and W stays empty. Every stage that sends
// spends time handing messages to the transport.
TEST(StageExecutor, MetricsSeparateTheWeightPassAndTheSends) {
  struct Case {
    v1::ScheduleKindProto schedule;
    int64_t micro_batches;
    bool weight_pass;
  };
  for (const Case& c :
       {Case{v1::SCHEDULE_GPIPE, 1, false}, Case{v1::SCHEDULE_GPIPE, 4, true},
        Case{v1::SCHEDULE_ZB_H1, 4, true}}) {
    SCOPED_TRACE(::testing::Message() << v1::ScheduleKindProto_Name(c.schedule)
                                      << " M=" << c.micro_batches);
    const v1::TrainingSpec spec = SmallMlpSpec(c.micro_batches, false);
    Pipeline p = BuildPipeline(spec, {3}, c.schedule);
    ASSERT_EQ(p.metrics.size(), 2u);
    ASSERT_TRUE(TrainAll(p, spec.steps()).ok());
    for (size_t s = 0; s < p.metrics.size(); ++s) {
      const StageMetrics& m = *p.metrics[s];
      const double backward =
          m.compute_seconds(StageMetrics::kBackward)->Value();
      const double weight = m.compute_seconds(StageMetrics::kWeight)->Value();
      EXPECT_GT(m.compute_seconds(StageMetrics::kForward)->Value(), 0) << s;
      EXPECT_GT(backward, 0) << s;
      if (c.weight_pass) {
        EXPECT_GT(weight, 0) << s;
      } else {
        EXPECT_EQ(weight, 0) << s;
      }
      // Stage 0 sends activations, stage 1 gradients.
      EXPECT_GT(m.send_seconds()->Value(), 0) << s;
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
      ExpectInterleavedMatchesReference(SmallMlpSpec(m, remat), 1, 2, {3});
      ExpectInterleavedMatchesReference(SmallMlpSpec(m, remat), 2, 2,
                                        {2, 4, 5});
      ExpectInterleavedMatchesReference(SmallMlpSpec(m, remat), 2, 3,
                                        {1, 2, 3, 4, 5});
    }
    // K = 3 needs M divisible by 3: 48 samples in 3 or 6 micro-batches.
    for (int64_t m : {3, 6}) {
      SCOPED_TRACE(::testing::Message() << "K=3 M=" << m << " remat=" << remat);
      v1::TrainingSpec spec = SmallMlpSpec(m, remat);
      spec.set_batch_size(48);
      ExpectInterleavedMatchesReference(spec, 3, 2, {1, 2, 3, 4, 5});
    }
  }
}

TEST(StageExecutor, InterleavedConfigsAndMessagesAreChecked) {
  Pipeline p = BuildInterleaved(SmallMlpSpec(4, false), 2, 2, {2, 4, 5},
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
  good.samples = 1024;
  good.tensors = {Tensor::Host({8, 32})};
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
    Pipeline p = BuildPipeline(SmallMlpSpec(8, remat), {3});
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
  *config.mutable_spec() = SmallMlpSpec(4, false);
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
  good.samples = 1024;
  good.tensors = {Tensor::Host({8, 32})};
  EXPECT_TRUE((*stage)->ValidateIncoming(good).ok())
      << (*stage)->ValidateIncoming(good);
  // Labels do not travel: an activation carries its own tensor only, and
  // the size of stage 0's split.
  StageMessage labelled = good;
  labelled.tensors.push_back(Tensor::Host({8}));
  EXPECT_EQ((*stage)->ValidateIncoming(labelled).code(),
            absl::StatusCode::kInvalidArgument);
  StageMessage unsized = good;
  unsized.samples = 0;
  EXPECT_EQ((*stage)->ValidateIncoming(unsized).code(),
            absl::StatusCode::kInvalidArgument);
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

  // A stage that has not trained takes step 0; step 1 once an activation
  // of step 0 said the run goes on (stage 0 has committed to step 1), but
  // never step 2, however many later activations say so.
  auto idle = StageExecutor::Create(config, backend.get());
  ASSERT_TRUE(idle.ok()) << idle.status();
  StageMessage ahead = good;
  ahead.step = 1;
  EXPECT_EQ((*idle)->ValidateIncoming(ahead).code(),
            absl::StatusCode::kInvalidArgument);
  StageMessage last = good;
  last.value = static_cast<int>(StepEnd::kEndRun);
  EXPECT_TRUE((*idle)->ValidateIncoming(last).ok());
  EXPECT_EQ((*idle)->ValidateIncoming(ahead).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*idle)->ValidateIncoming(good).ok());
  EXPECT_TRUE((*idle)->ValidateIncoming(ahead).ok())
      << (*idle)->ValidateIncoming(ahead);
  StageMessage further = good;
  further.step = 2;
  EXPECT_EQ((*idle)->ValidateIncoming(further).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(StageExecutor, AMissingNeighbourFailsTheStepInBoundedTime) {
  v1::TrainingSpec spec = SmallMlpSpec(4, false);
  Pipeline p = BuildPipeline(spec, {3});
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
  v1::TrainingSpec spec = SmallMlpSpec(4, false);
  spec.set_steps(100000);
  Pipeline p = BuildPipeline(spec, {3});
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
    v1::TrainingSpec spec = SmallMlpSpec(kMicroBatches, false);
    spec.set_steps(kSteps);
    Pipeline p = BuildPipeline(spec, {2, 5}, schedule);
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

// Which instructions ran the weight-gradient products a stage held back,
// as its trace says. Stage 0 holds the x and dy rows of a 12 -> 32 linear
// (44 floats a row), stage 1 those of 32 -> 16 and 16 -> 4 (68). With
// micro-batches of 4 rows every schedule runs a step's 8 at its optimizer
// step; with 192 rows a micro-batch (batch 768, M = 4) a second one would
// pass 256 rows, so each backward from the second on runs the one before,
// and the step the last. One micro-batch a step holds nothing.
TEST(StageExecutor, TheTraceSaysWhereHeldWeightGradientsRan) {
  struct Case {
    v1::ScheduleKindProto schedule;
    int64_t batch;
    int64_t micro_batches;
    // The instructions that ran some ("op mb"), and how many micro-batches'.
    std::map<std::string, int64_t> runs;
  };
  const std::map<std::string, int64_t> eight_at_step = {{"Step 0", 8}};
  for (const Case& c :
       {Case{v1::SCHEDULE_GPIPE, 32, 8, eight_at_step},
        Case{v1::SCHEDULE_1F1B_FLUSH, 32, 8, eight_at_step},
        Case{v1::SCHEDULE_ZB_H1, 32, 8, eight_at_step},
        Case{v1::SCHEDULE_GPIPE,
             768,
             4,
             {{"B 1", 1}, {"B 2", 1}, {"B 3", 1}, {"Step 0", 1}}},
        Case{v1::SCHEDULE_GPIPE, 32, 1, {}}}) {
    SCOPED_TRACE(::testing::Message()
                 << v1::ScheduleKindProto_Name(c.schedule) << " batch "
                 << c.batch << " M=" << c.micro_batches);
    v1::TrainingSpec spec = SmallMlpSpec(c.micro_batches, false);
    spec.set_batch_size(c.batch);
    Pipeline p = BuildPipeline(spec, {3}, c.schedule);
    for (auto& stage : p.stages) ASSERT_TRUE(stage->Train(1).ok());
    for (auto& stage : p.stages) ASSERT_TRUE(stage->Wait().ok());
    const int64_t rows = c.batch / c.micro_batches;
    const int64_t floats_a_row[2] = {12 + 32, (32 + 16) + (16 + 4)};
    for (int s = 0; s < 2; ++s) {
      SCOPED_TRACE(::testing::Message() << "stage " << s);
      const int64_t micro_batch_bytes =
          rows * floats_a_row[s] * static_cast<int64_t>(sizeof(float));
      std::map<std::string, int64_t> want;
      for (const auto& [op, micro_batches] : c.runs) {
        want[op] = micro_batches * micro_batch_bytes;
      }
      std::map<std::string, int64_t> ran;  // "op mb" -> bytes run
      const v1::GetTraceResponse trace = p.stages[s]->Trace(0);
      for (const v1::TraceEvent& e : trace.events()) {
        if (e.weight_grad_bytes_run() == 0) continue;
        ran[absl::StrCat(e.op(), " ", e.micro_batch())] +=
            e.weight_grad_bytes_run();
      }
      EXPECT_EQ(ran, want);
    }
  }
}

// ZB-H1 frees a micro-batch's activations after W, so its peak is no lower
// than 1F1B-flush's, and no higher than GPipe's (which holds all M).
TEST(StageExecutor, ZeroBubbleActivationMemoryLiesBetween1F1BAndGPipe) {
  std::map<v1::ScheduleKindProto, int64_t> peak;
  for (v1::ScheduleKindProto schedule :
       {v1::SCHEDULE_GPIPE, v1::SCHEDULE_1F1B_FLUSH, v1::SCHEDULE_ZB_H1}) {
    Pipeline p = BuildPipeline(SmallMlpSpec(8, false), {2, 5}, schedule);
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
