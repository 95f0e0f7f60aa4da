#include "worker/data/dataset.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A dataset whose samples encode their own index, so a batch shows exactly
// which samples it holds.
class FakeDataset final : public Dataset {
 public:
  explicit FakeDataset(int64_t size, DataParts parts = kAllDataParts)
      : size_(size), parts_(parts) {}
  int64_t size() const override { return size_; }
  Shape sample_shape() const override { return {2, 3}; }
  Shape label_shape() const override { return {}; }
  int64_t num_classes() const override { return 7; }
  DataParts parts() const override { return parts_; }
  void GetInput(int64_t index, float* input) const override {
    for (int k = 0; k < 6; ++k) input[k] = static_cast<float>(index * 100 + k);
  }
  void GetLabel(int64_t index, float* label) const override {
    label[0] = static_cast<float>(index % 7);
  }

 private:
  const int64_t size_;
  const DataParts parts_;
};

// All indices of epoch `epoch`, in step order.
std::vector<int64_t> EpochIndices(const SampleOrder& order, int64_t epoch) {
  std::vector<int64_t> all;
  for (int64_t s = 0; s < order.steps_per_epoch(); ++s) {
    const std::vector<int64_t> step =
        order.IndicesForStep(epoch * order.steps_per_epoch() + s);
    all.insert(all.end(), step.begin(), step.end());
  }
  return all;
}

TEST(SampleOrderTest, EachEpochIsAPermutation) {
  const SampleOrder order(/*dataset_size=*/1000, /*batch_size=*/10,
                          /*seed=*/42);
  ASSERT_EQ(order.steps_per_epoch(), 100);
  std::vector<int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> indices = EpochIndices(order, epoch);
    EXPECT_NE(indices, identity) << "epoch " << epoch << " is not shuffled";
    std::sort(indices.begin(), indices.end());
    EXPECT_EQ(indices, identity) << "epoch " << epoch;
  }
}

TEST(SampleOrderTest, TailThatDoesNotFillABatchIsLeftOut) {
  const SampleOrder order(/*dataset_size=*/1003, /*batch_size=*/10,
                          /*seed=*/7);
  ASSERT_EQ(order.steps_per_epoch(), 100);
  const std::vector<int64_t> indices = EpochIndices(order, 0);
  const std::set<int64_t> distinct(indices.begin(), indices.end());
  EXPECT_EQ(distinct.size(), 1000u);
  EXPECT_GE(*distinct.begin(), 0);
  EXPECT_LT(*distinct.rbegin(), 1003);
}

TEST(SampleOrderTest, StepMapsToItsEpoch) {
  const SampleOrder order(/*dataset_size=*/100, /*batch_size=*/8, /*seed=*/1);
  EXPECT_EQ(order.steps_per_epoch(), 12);
  EXPECT_EQ(order.EpochOfStep(11), 0);
  EXPECT_EQ(order.EpochOfStep(12), 1);
  EXPECT_EQ(order.IndicesForStep(25).size(), 8u);
}

TEST(SampleOrderTest, DifferentEpochsDiffer) {
  const SampleOrder order(/*dataset_size=*/500, /*batch_size=*/50,
                          /*seed=*/3);
  EXPECT_NE(EpochIndices(order, 0), EpochIndices(order, 1));
  EXPECT_NE(EpochIndices(order, 1), EpochIndices(order, 2));
}

TEST(SampleOrderTest, SameSeedAndStepGiveSameIndicesFromAFreshObject) {
  const SampleOrder first(/*dataset_size=*/60000, /*batch_size=*/64,
                          /*seed=*/2024);
  for (int64_t step : {0, 1, 937, 938, 5000}) {
    const SampleOrder fresh(60000, 64, 2024);
    EXPECT_EQ(first.IndicesForStep(step), fresh.IndicesForStep(step))
        << "step " << step;
  }
}

TEST(SampleOrderTest, DifferentSeedsDiffer) {
  const SampleOrder a(/*dataset_size=*/1000, /*batch_size=*/10, /*seed=*/1);
  const SampleOrder b(/*dataset_size=*/1000, /*batch_size=*/10, /*seed=*/2);
  EXPECT_NE(a.IndicesForStep(0), b.IndicesForStep(0));
  EXPECT_NE(EpochIndices(a, 0), EpochIndices(b, 0));
}

TEST(SampleOrderTest, BatchLargerThanDatasetIsOneStepPerEpoch) {
  const SampleOrder order(/*dataset_size=*/5, /*batch_size=*/8, /*seed=*/9);
  EXPECT_EQ(order.steps_per_epoch(), 1);
  const std::vector<int64_t> indices = order.IndicesForStep(0);
  ASSERT_EQ(indices.size(), 8u);
  std::vector<int64_t> first_pass(indices.begin(), indices.begin() + 5);
  std::sort(first_pass.begin(), first_pass.end());
  EXPECT_THAT(first_pass, ElementsAre(0, 1, 2, 3, 4));
}

// A shuffle that favoured some positions would bias training; every sample
// should be about equally likely to come first.
TEST(SampleOrderTest, FirstPositionIsRoughlyUniform) {
  constexpr int64_t kSize = 8;
  constexpr int64_t kEpochs = 4000;
  const SampleOrder order(kSize, /*batch_size=*/1, /*seed=*/11);
  std::vector<int> counts(kSize, 0);
  for (int64_t epoch = 0; epoch < kEpochs; ++epoch) {
    ++counts[order.IndicesForStep(epoch * kSize)[0]];
  }
  // Expected 500 each, standard deviation about 21.
  for (int64_t i = 0; i < kSize; ++i) {
    EXPECT_GT(counts[i], 400) << "sample " << i;
    EXPECT_LT(counts[i], 600) << "sample " << i;
  }
}

TEST(GatherBatchTest, StacksSamplesInIndexOrder) {
  const FakeDataset dataset(10);
  const std::vector<int64_t> indices = {3, 0, 9};
  absl::StatusOr<Batch> batch = GatherBatch(dataset, indices);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_THAT(batch->inputs.shape(), ElementsAre(3, 2, 3));
  EXPECT_THAT(batch->labels.shape(), ElementsAre(3));
  const std::vector<float> inputs = batch->inputs.ToVector();
  EXPECT_EQ(inputs[0], 300.0f);
  EXPECT_EQ(inputs[5], 305.0f);
  EXPECT_EQ(inputs[6], 0.0f);
  EXPECT_EQ(inputs[12], 900.0f);
  EXPECT_EQ(inputs[17], 905.0f);
  EXPECT_THAT(batch->labels.ToVector(), ElementsAre(3.0f, 0.0f, 2.0f));
}

TEST(GatherBatchTest, IndexOutsideTheDatasetIsOutOfRange) {
  const FakeDataset dataset(10);
  for (int64_t bad : {int64_t{10}, int64_t{-1}}) {
    const std::vector<int64_t> indices = {0, bad};
    absl::StatusOr<Batch> batch = GatherBatch(dataset, indices);
    ASSERT_FALSE(batch.ok());
    EXPECT_EQ(batch.status().code(), absl::StatusCode::kOutOfRange);
    EXPECT_THAT(batch.status().message(), HasSubstr(std::to_string(bad)));
  }
}

TEST(GatherBatchTest, OnePartGathersWhatTheBatchHolds) {
  const FakeDataset dataset(10);
  const std::vector<int64_t> indices = {3, 0, 9};
  absl::StatusOr<Batch> batch = GatherBatch(dataset, indices);
  ASSERT_TRUE(batch.ok()) << batch.status();
  const FakeDataset inputs_only(10, kInputsOnly);
  absl::StatusOr<Tensor> inputs = GatherInputs(inputs_only, indices);
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  EXPECT_EQ(inputs->shape(), batch->inputs.shape());
  EXPECT_EQ(inputs->ToVector(), batch->inputs.ToVector());
  const FakeDataset labels_only(10, kLabelsOnly);
  absl::StatusOr<Tensor> labels = GatherLabels(labels_only, indices);
  ASSERT_TRUE(labels.ok()) << labels.status();
  EXPECT_EQ(labels->shape(), batch->labels.shape());
  EXPECT_EQ(labels->ToVector(), batch->labels.ToVector());

  // A part the dataset was not opened for is refused, never read.
  EXPECT_EQ(GatherLabels(inputs_only, indices).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(GatherInputs(labels_only, indices).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(GatherBatch(labels_only, indices).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(GatherLabels(labels_only, std::vector<int64_t>{10}).status().code(),
            absl::StatusCode::kOutOfRange);
}

TEST(OpenDatasetTest, NoSourceIsInvalidArgumentNamingData) {
  absl::StatusOr<DatasetPair> pair = OpenDataset(v1::DatasetSpec(), 1);
  ASSERT_FALSE(pair.ok());
  EXPECT_EQ(pair.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(pair.status().message(), HasSubstr("data"));
}

TEST(OpenDatasetTest, DispatchesOnTheSource) {
  v1::DatasetSpec spec;
  v1::SyntheticSource* synthetic = spec.mutable_synthetic();
  synthetic->set_features(4);
  synthetic->set_classes(3);
  synthetic->set_train_samples(50);
  synthetic->set_eval_samples(20);
  absl::StatusOr<DatasetPair> pair = OpenDataset(spec, 5);
  ASSERT_TRUE(pair.ok()) << pair.status();
  EXPECT_EQ(pair->train->size(), 50);
  EXPECT_EQ(pair->eval->size(), 20);
  EXPECT_THAT(pair->train->sample_shape(), ElementsAre(4));
  EXPECT_EQ(pair->train->num_classes(), 3);
  EXPECT_EQ(OpenDataset(spec, 5, DataParts{false, false}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain
