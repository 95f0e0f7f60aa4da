#include "worker/pipeline/local_trainer.h"

#include <cstdlib>
#include <string>

#include "common/proto_json.h"
#include "gtest/gtest.h"
#include "worker/compute/cpu/cpu_backend.h"

namespace pipetrain {
namespace {

std::string ExamplePath(const std::string& name) {
  const char* root = std::getenv("PIPETRAIN_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/examples/" + name;
}

v1::TrainingSpec SyntheticSpec(int64_t micro_batches) {
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
        {"linear": {"inFeatures": 32, "outFeatures": 4}}
      ]},
    "data": {"synthetic": {"features": 12, "classes": 4,
                           "trainSamples": 2048, "evalSamples": 512}},
    "optimizer": {"sgd": {"lr": 0.1, "momentum": 0.9, "weightDecay": 1e-4},
                  "clipGradNorm": 5.0},
    "batchSize": 32, "steps": 150, "seed": 7})",
                                        &spec);
  EXPECT_TRUE(status.ok()) << status;
  spec.set_micro_batches(micro_batches);
  return spec;
}

TEST(LocalTrainer, LearnsTheSyntheticTask) {
  auto backend = CreateCpuBackend(1);
  auto trainer = LocalTrainer::Create(SyntheticSpec(1), backend.get());
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto before = (*trainer)->Evaluate();
  ASSERT_TRUE(before.ok()) << before.status();
  while ((*trainer)->step() < (*trainer)->total_steps()) {
    ASSERT_TRUE((*trainer)->Step().ok());
  }
  auto after = (*trainer)->Evaluate();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->samples, 512);
  EXPECT_LT(after->loss, 0.6 * before->loss);
  EXPECT_GT(after->accuracy, 0.8);
}

// GPipe semantics: splitting the mini-batch into micro-batches changes
// nothing but float summation order. (Dropout masks are drawn per
// micro-batch, so this check turns dropout off.)
TEST(LocalTrainer, MicroBatchingMatchesTheWholeMiniBatch) {
  auto backend = CreateCpuBackend(1);
  std::vector<std::vector<Tensor>> finals;
  std::vector<std::vector<double>> losses;
  for (int64_t m : {1, 4, 8}) {
    v1::TrainingSpec spec = SyntheticSpec(m);
    spec.set_steps(20);
    spec.mutable_model()->mutable_layers(2)->mutable_dropout()->set_rate(0);
    auto trainer = LocalTrainer::Create(spec, backend.get());
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    losses.emplace_back();
    for (int i = 0; i < 20; ++i) {
      auto r = (*trainer)->Step();
      ASSERT_TRUE(r.ok()) << r.status();
      losses.back().push_back(r->loss);
    }
    auto params = (*trainer)->model()->ParamsToHost();
    ASSERT_TRUE(params.ok());
    finals.push_back(*params);
  }
  for (size_t run = 1; run < finals.size(); ++run) {
    for (size_t s = 0; s < losses[0].size(); ++s) {
      EXPECT_NEAR(losses[run][s], losses[0][s], 1e-5 * losses[0][s]);
    }
    for (size_t p = 0; p < finals[0].size(); ++p) {
      const std::vector<float> a = finals[0][p].ToVector();
      const std::vector<float> b = finals[run][p].ToVector();
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_NEAR(b[i], a[i], 1e-5 * std::max(1.0f, std::fabs(a[i])))
            << "param " << p << " element " << i;
      }
    }
  }
}

TEST(LocalTrainer, SameSeedSameRunDifferentSeedDifferentRun) {
  auto backend = CreateCpuBackend(1);
  auto run = [&](uint64_t seed) {
    v1::TrainingSpec spec = SyntheticSpec(2);
    spec.set_seed(seed);
    auto trainer = LocalTrainer::Create(spec, backend.get());
    EXPECT_TRUE(trainer.ok());
    std::vector<double> out;
    for (int i = 0; i < 5; ++i) out.push_back((*trainer)->Step()->loss);
    return out;
  };
  EXPECT_EQ(run(3), run(3));
  EXPECT_NE(run(3), run(4));
}

TEST(LocalTrainer, BadSpecsAreRejectedWithTheField) {
  auto backend = CreateCpuBackend(1);
  v1::TrainingSpec spec = SyntheticSpec(5);  // 5 does not divide 32
  auto t = LocalTrainer::Create(spec, backend.get());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("micro_batches"), std::string::npos);
  spec = SyntheticSpec(1);
  spec.mutable_model()->set_input_shape(0, 13);
  t = LocalTrainer::Create(spec, backend.get());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  spec = SyntheticSpec(1);
  spec.set_steps(0);
  t = LocalTrainer::Create(spec, backend.get());
  EXPECT_NE(t.status().message().find("steps"), std::string::npos);
}

TEST(LocalTrainer, FashionMnistMlpReaches85PercentTestAccuracy) {
  v1::TrainingSpec spec;
  ASSERT_TRUE(
      ReadJsonFile(ExamplePath("fashion_mnist_mlp.job.json"), &spec).ok());
  auto backend = CreateCpuBackend(0);
  auto trainer = LocalTrainer::Create(spec, backend.get());
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  while ((*trainer)->step() < (*trainer)->total_steps()) {
    auto r = (*trainer)->Step();
    ASSERT_TRUE(r.ok()) << r.status();
  }
  auto eval = (*trainer)->Evaluate();
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_EQ(eval->samples, 10000);
  EXPECT_GE(eval->accuracy, 0.85);
  std::printf("fashion-mnist test accuracy %.4f after %lld steps\n",
              eval->accuracy, static_cast<long long>((*trainer)->step()));
}

TEST(LocalTrainer, CharTransformerLossFalls) {
  v1::TrainingSpec spec;
  ASSERT_TRUE(
      ReadJsonFile(ExamplePath("char_transformer.job.json"), &spec).ok());
  spec.set_steps(60);
  auto backend = CreateCpuBackend(0);
  auto trainer = LocalTrainer::Create(spec, backend.get());
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  double first = 0, last = 0;
  while ((*trainer)->step() < (*trainer)->total_steps()) {
    auto r = (*trainer)->Step();
    ASSERT_TRUE(r.ok()) << r.status();
    if (r->step == 0) first = r->loss;
    last = r->loss;
  }
  // Uniform guessing over 256 bytes costs ln(256) = 5.55.
  EXPECT_NEAR(first, std::log(256.0), 0.5);
  EXPECT_LT(last, first - 1.5);
}

}  // namespace
}  // namespace pipetrain
