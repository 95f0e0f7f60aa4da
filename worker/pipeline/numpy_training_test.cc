// Training from .npy files equals training from the IDX files they were
// made from. The .npy files are written by the documented snippet
// (examples/fashion_mnist_to_npy.py, shown in docs/DATASETS.md) from
// Debian's dataset-fashion-mnist; the job is the example
// examples/fashion_mnist_npy.job.json, which must be the IDX example
// examples/fashion_mnist_mlp.job.json with only its data changed. Needs
// python3-numpy and dataset-fashion-mnist (deploy/setup.sh).
#include <stdlib.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/proto_json.h"
#include "common/temp_dir_for_test.h"
#include "gtest/gtest.h"
#include "spec/training_spec.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/data/dataset.h"
#include "worker/pipeline/local_trainer.h"

namespace pipetrain {
namespace {

constexpr int kSteps = 4;
constexpr char kExampleDir[] = "/usr/share/datasets/fashion-mnist-npy";

std::string SourceDir() {
  const char* source = std::getenv("PIPETRAIN_SOURCE_DIR");
  EXPECT_NE(source, nullptr) << "PIPETRAIN_SOURCE_DIR is set by ctest";
  return source == nullptr ? "." : source;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

v1::TrainingSpec ReadJob(const std::string& name) {
  v1::TrainingSpec spec;
  const absl::Status status =
      ReadJsonFile(absl::StrCat(SourceDir(), "/examples/", name), &spec);
  EXPECT_TRUE(status.ok()) << status;
  return spec;
}

// The example's paths moved from the package directory to `dir`.
v1::TrainingSpec NpyJob(const std::string& dir) {
  v1::TrainingSpec spec = ReadJob("fashion_mnist_npy.job.json");
  v1::NumpySource* n = spec.mutable_data()->mutable_numpy();
  for (std::string* path :
       {n->mutable_train_features(), n->mutable_train_labels(),
        n->mutable_eval_features(), n->mutable_eval_labels()}) {
    EXPECT_EQ(path->rfind(kExampleDir, 0), 0u) << *path;
    *path = absl::StrReplaceAll(*path, {{kExampleDir, dir}});
  }
  return spec;
}

// Runs the snippet once for the suite (it reads 60,000 images).
class NumpyTrainingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    const std::string command =
        absl::StrCat("/usr/bin/python3 ", SourceDir(),
                     "/examples/fashion_mnist_to_npy.py ", dir_->path());
    const int status = std::system(command.c_str());
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << command << " failed (python3-numpy, dataset-fashion-mnist?)";
  }
  static void TearDownTestSuite() { delete dir_; }
  static ScopedTempDir* dir_;
};

ScopedTempDir* NumpyTrainingTest::dir_ = nullptr;

TEST_F(NumpyTrainingTest, DocumentedSnippetIsTheExampleScript) {
  const std::string script =
      ReadText(SourceDir() + "/examples/fashion_mnist_to_npy.py");
  const std::string docs = ReadText(SourceDir() + "/docs/DATASETS.md");
  ASSERT_FALSE(script.empty());
  EXPECT_NE(docs.find(script), std::string::npos)
      << "docs/DATASETS.md must show examples/fashion_mnist_to_npy.py as is";
}

TEST_F(NumpyTrainingTest, ExampleJobIsTheIdxJobWithNpyData) {
  const v1::TrainingSpec npy = NpyJob(dir_->path());
  EXPECT_TRUE(ValidateTrainingSpec(npy).ok()) << ValidateTrainingSpec(npy);
  v1::TrainingSpec idx = ReadJob("fashion_mnist_mlp.job.json");
  *idx.mutable_data() = npy.data();
  idx.set_name(npy.name());
  EXPECT_EQ(idx.SerializeAsString(), npy.SerializeAsString());
}

TEST_F(NumpyTrainingTest, SameBatchesAndWeightsAsTheIdxFiles) {
  v1::TrainingSpec idx = ReadJob("fashion_mnist_mlp.job.json");
  v1::TrainingSpec npy = NpyJob(dir_->path());
  idx.set_steps(kSteps);
  npy.set_steps(kSteps);

  absl::StatusOr<DatasetPair> idx_data = OpenDataset(idx.data(), idx.seed());
  absl::StatusOr<DatasetPair> npy_data = OpenDataset(npy.data(), npy.seed());
  ASSERT_TRUE(idx_data.ok()) << idx_data.status();
  ASSERT_TRUE(npy_data.ok()) << npy_data.status();
  ASSERT_EQ(npy_data->train->size(), idx_data->train->size());
  ASSERT_EQ(npy_data->eval->size(), idx_data->eval->size());
  const SampleOrder order(idx_data->train->size(), idx.batch_size(),
                          idx.seed());
  for (int64_t step = 0; step < kSteps; ++step) {
    const std::vector<int64_t> indices = order.IndicesForStep(step);
    absl::StatusOr<Batch> a = GatherBatch(*idx_data->train, indices);
    absl::StatusOr<Batch> b = GatherBatch(*npy_data->train, indices);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->inputs.shape(), b->inputs.shape());
    for (int64_t i = 0; i < a->labels.numel(); ++i) {
      ASSERT_EQ(a->labels.f32()[i], b->labels.f32()[i]) << step;
    }
    for (int64_t i = 0; i < a->inputs.numel(); ++i) {
      // The IDX reader divides by 255, the .npy one multiplies by the
      // float nearest 1/255: the same value within rounding.
      ASSERT_NEAR(a->inputs.f32()[i], b->inputs.f32()[i], 1e-6) << step;
    }
  }

  auto backend = CreateCpuBackend(1);
  auto idx_trainer = LocalTrainer::Create(idx, backend.get());
  auto npy_trainer = LocalTrainer::Create(npy, backend.get());
  ASSERT_TRUE(idx_trainer.ok()) << idx_trainer.status();
  ASSERT_TRUE(npy_trainer.ok()) << npy_trainer.status();
  auto initial = (*idx_trainer)->model()->ParamsToHost();
  ASSERT_TRUE(initial.ok());
  for (int step = 0; step < kSteps; ++step) {
    absl::StatusOr<StepReport> a = (*idx_trainer)->Step();
    absl::StatusOr<StepReport> b = (*npy_trainer)->Step();
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_NEAR(a->loss, b->loss, 1e-6) << step;
  }
  auto wa = (*idx_trainer)->model()->ParamsToHost();
  auto wb = (*npy_trainer)->model()->ParamsToHost();
  ASSERT_TRUE(wa.ok() && wb.ok());
  ASSERT_EQ(wa->size(), wb->size());
  double max_diff = 0.0, max_update = 0.0;
  for (size_t p = 0; p < wa->size(); ++p) {
    ASSERT_EQ((*wa)[p].shape(), (*wb)[p].shape());
    for (int64_t i = 0; i < (*wa)[p].numel(); ++i) {
      const float a = (*wa)[p].f32()[i];
      max_diff = std::max<double>(max_diff, std::fabs(a - (*wb)[p].f32()[i]));
      max_update =
          std::max<double>(max_update, std::fabs(a - (*initial)[p].f32()[i]));
    }
  }
  std::printf("max |weight difference| %.3g, max |update| %.3g\n", max_diff,
              max_update);
  EXPECT_LE(max_diff, 1e-6)
      << "absolute weight difference after " << kSteps << " steps";
  // The steps trained: equal weights are not the untouched initial ones.
  EXPECT_GT(max_update, 1e-3);
}

}  // namespace
}  // namespace pipetrain
