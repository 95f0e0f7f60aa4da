#include "worker/compute/tensor.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"
#include "worker/compute/half.h"

namespace pipetrain {
namespace {

TEST(Tensor, HostTensorsAreZeroedAndShaped) {
  Tensor t = Tensor::Host({2, 3});
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.bytes(), 24u);
  EXPECT_EQ(t.dim(-1), 3);
  for (float v : t.ToVector()) EXPECT_EQ(v, 0.0f);
}

// A size that overflows is refused before any allocation (a wrapped size
// would allocate a few bytes and be written far past them).
TEST(Tensor, TryHostRefusesSizesThatOverflow) {
  const int64_t big = int64_t{1} << 40;
  const absl::StatusOr<Tensor> t = Tensor::TryHost({big, big});
  EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(t.status().message().find("[1099511627776, 1099511627776]"),
            std::string::npos)
      << t.status();
  EXPECT_EQ(Tensor::TryHost({-1, 4}).status().code(),
            absl::StatusCode::kResourceExhausted);
  // 2^62 elements fit int64 but not as float32 bytes.
  EXPECT_EQ(Tensor::TryHost({int64_t{1} << 62}).status().code(),
            absl::StatusCode::kResourceExhausted);
  const absl::StatusOr<Tensor> small = Tensor::TryHost({2, 3});
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->ToVector(), std::vector<float>(6, 0.0f));
}

TEST(Tensor, ReshapeAndSliceShareStorage) {
  Tensor t = Tensor::HostFrom({4, 2}, {0, 1, 2, 3, 4, 5, 6, 7});
  auto rows = t.SliceRows(1, 3);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(rows->shape(), (Shape{2, 2}));
  EXPECT_EQ(rows->ToVector(), (std::vector<float>{2, 3, 4, 5}));
  rows->f32()[0] = 42;
  EXPECT_EQ(t.f32()[2], 42);
  EXPECT_FALSE(t.Reshaped({3, 3}).ok());
  EXPECT_FALSE(t.SliceRows(3, 5).ok());
  auto flat = t.Reshaped({8});
  ASSERT_TRUE(flat.ok());
  EXPECT_EQ(flat->f32()[2], 42);
}

TEST(Half, Bf16RoundsToNearestEven) {
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f)), 1.0f);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(-2.5f)), -2.5f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (1.0).
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  const float x = 3.14159f;
  EXPECT_NEAR(Bf16ToFloat(FloatToBf16(x)), x, x / 128);
}

TEST(Half, Fp16CoversNormalsSubnormalsAndOverflow) {
  for (float x : {0.0f, 1.0f, -1.5f, 65504.0f, 0.000061035156f, 1e-7f}) {
    const float back = HalfToFloat(FloatToHalf(x));
    EXPECT_NEAR(back, x, std::max(std::fabs(x) / 1024, 6e-8f)) << x;
  }
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(1e6f))));
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
  // Every finite half value survives a round trip through float.
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    ASSERT_EQ(FloatToHalf(HalfToFloat(static_cast<uint16_t>(h))), h) << h;
  }
}

TEST(Tensor, ConvertDTypeRoundTrips) {
  Tensor t = Tensor::HostFrom({3}, {1.0f, -0.5f, 1024.0f});
  for (DType d : {DType::kBF16, DType::kF16}) {
    auto half = ConvertDType(t, d);
    ASSERT_TRUE(half.ok());
    EXPECT_EQ(half->bytes(), 6u);
    auto back = ConvertDType(*half, DType::kF32);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(back->ToVector(), t.ToVector());
  }
}

}  // namespace
}  // namespace pipetrain
