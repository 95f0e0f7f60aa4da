// Tensor <-> TensorProto: exact round trips for every dtype, and malformed
// protos refused with the tensor's name.
#include "worker/compute/tensor_proto.h"

#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

TEST(TensorProto, RoundTripsEveryDTypeBitForBit) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    Tensor t = Tensor::Host({2, 3}, dtype);
    for (size_t i = 0; i < t.bytes(); ++i) {
      static_cast<unsigned char*>(t.raw())[i] =
          static_cast<unsigned char>(i * 7 + 1);
    }
    absl::StatusOr<v1::TensorProto> proto = TensorToProto("w", t);
    ASSERT_TRUE(proto.ok()) << proto.status();
    EXPECT_EQ(proto->name(), "w");
    EXPECT_EQ(proto->shape_size(), 2);
    EXPECT_EQ(proto->data().size(), t.bytes());
    absl::StatusOr<Tensor> back = TensorFromProto(*proto);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->dtype(), dtype);
    EXPECT_EQ(back->shape(), t.shape());
    EXPECT_EQ(std::memcmp(back->raw(), t.raw(), t.bytes()), 0);
  }
}

TEST(TensorProto, Float32ValuesSurvive) {
  Tensor t = Tensor::HostFrom({3}, {1.5f, -2.25f, 1e-20f});
  absl::StatusOr<Tensor> back = TensorFromProto(*TensorToProto("b", t));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->ToVector(), t.ToVector());
  EXPECT_EQ(TensorToProto("b", t)->dtype(), v1::DTYPE_F32);
}

TEST(TensorProto, MalformedProtosAreRefusedByName) {
  v1::TensorProto p;
  p.set_name("layers.0.weight");
  p.add_shape(2);
  p.add_shape(2);
  p.set_data(std::string(12, '\0'));  // f32 [2, 2] needs 16
  absl::StatusOr<Tensor> short_data = TensorFromProto(p);
  EXPECT_EQ(short_data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(short_data.status().message(), HasSubstr("layers.0.weight"));
  EXPECT_THAT(short_data.status().message(), HasSubstr("needs 16"));

  p.set_data(std::string(16, '\0'));
  EXPECT_TRUE(TensorFromProto(p).ok());
  p.set_dtype(static_cast<v1::DType>(9));
  EXPECT_EQ(TensorFromProto(p).status().code(),
            absl::StatusCode::kInvalidArgument);

  p.set_dtype(v1::DTYPE_F32);
  p.set_shape(0, -2);
  EXPECT_EQ(TensorFromProto(p).status().code(),
            absl::StatusCode::kInvalidArgument);
  p.set_shape(0, int64_t{1} << 40);
  p.set_shape(1, int64_t{1} << 40);
  EXPECT_THAT(TensorFromProto(p).status().message(), HasSubstr("too large"));
}

TEST(TensorProto, OnlyHostTensorsConvert) {
  EXPECT_EQ(TensorToProto("empty", Tensor()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain
