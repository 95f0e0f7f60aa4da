// Sizes a spec implies are checked with overflow-safe arithmetic against
// fixed caps, so nothing downstream allocates what a spec's numbers wrap to.
#include "spec/size_limits.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/proto_json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/training_spec.h"

namespace pipetrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

v1::TrainingSpec Mlp(int64_t batch, int64_t input, int64_t hidden) {
  v1::TrainingSpec spec;
  const absl::Status parsed = ParseJson(
      absl::StrCat(R"({"model": {"inputKind": "INPUT_KIND_FLOAT",
        "inputShape": [)",
                   input, R"(], "loss": "LOSS_KIND_SOFTMAX_CROSS_ENTROPY",
        "layers": [{"linear": {"inFeatures": )",
                   input, R"(, "outFeatures": )", hidden,
                   R"(}}, {"relu": {}},
          {"linear": {"inFeatures": )",
                   hidden, R"(, "outFeatures": 10}}]},
        "optimizer": {"sgd": {"lr": 0.1}}, "steps": 1, "batchSize": )",
                   batch, "}"),
      &spec);
  EXPECT_TRUE(parsed.ok()) << parsed;
  return spec;
}

void ExpectInvalid(const v1::TrainingSpec& spec, const std::string& what,
                   const std::string& number) {
  const absl::Status status = ValidateTrainingSpec(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr(what), HasSubstr(number)));
}

TEST(SizeLimits, CheckedMulReportsOverflow) {
  EXPECT_EQ(CheckedMul(int64_t{1} << 31, int64_t{1} << 31),
            std::optional<int64_t>(int64_t{1} << 62));
  EXPECT_FALSE(CheckedMul(int64_t{1} << 32, int64_t{1} << 32).has_value());
  EXPECT_FALSE(CheckedMul(-1, 5).has_value());
  EXPECT_FALSE(CheckedMul(std::numeric_limits<int64_t>::max(), 2).has_value());
}

TEST(SizeLimits, ShapesWhoseProductWrapsAreRejected) {
  // 2^24 ^ 4 = 2^96 wraps int64 to 0: the unchecked product would pass.
  const Shape wraps = {1 << 24, 1 << 24, 1 << 24, 1 << 24};
  // (Computed unsigned: wrapping is defined there, not in int64.)
  uint64_t unchecked = 1;
  for (int64_t d : wraps) unchecked *= static_cast<uint64_t>(d);
  EXPECT_EQ(unchecked, 0u);
  const absl::StatusOr<int64_t> n = CheckedElements(wraps, "x");
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(n.status().message(), HasSubstr("2147483648 elements"));
  EXPECT_EQ(*CheckedElements({3, 5}, "x"), 15);
}

TEST(SizeLimits, TheReportedHugeBatchIsRejectedWithItsNumber) {
  EXPECT_TRUE(ValidateTrainingSpec(Mlp(64, 784, 256)).ok());
  ExpectInvalid(Mlp(1099511627776, 784, 256), "batch_size", "1099511627776");
  ExpectInvalid(Mlp(kMaxBatchSize + 1, 784, 256), "batch_size", "1048576");
}

TEST(SizeLimits, HugeLayersAndActivationsAreRejected) {
  // A 65536 x 65536 weight: 2^32 floats.
  ExpectInvalid(Mlp(8, 65536, 65536), "layers[0].linear weight", "2147483648");
  // 2^20 rows of 4096 features in one micro-batch: 2^32 floats.
  ExpectInvalid(Mlp(1 << 20, 4096, 16), "micro-batch's activation",
                "[1048576, 4096]");
  ExpectInvalid(Mlp(8, int64_t{1} << 40, 16), "model.input_shape",
                "1099511627776");
}

TEST(SizeLimits, FootprintCountsParametersAndTheLargestActivation) {
  v1::TrainingSpec spec = Mlp(64, 784, 256);
  spec.set_micro_batches(4);
  const absl::StatusOr<JobFootprint> f = EstimateFootprint(spec);
  ASSERT_TRUE(f.ok()) << f.status();
  // 784*256 + 256 + 256*10 + 10, counted by hand.
  EXPECT_EQ(f->parameters, 200960 + 2570);
  EXPECT_EQ(f->largest_activation_elements, 16 * 784);
  EXPECT_EQ(f->min_bytes, 4 * (2 * (200960 + 2570) + 16 * 784));
}

}  // namespace
}  // namespace pipetrain
