#include "spec/wire_size.h"

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(WireSize, PlainDtypesCountTheirElementSize) {
  EXPECT_EQ(StreamedTensorWireBytes({32, 2048}, v1::DTYPE_F32,
                                    v1::WIRE_QUANTIZATION_NONE, 0),
            32 * 2048 * 4);
  EXPECT_EQ(StreamedTensorWireBytes({32, 2048}, v1::DTYPE_BF16,
                                    v1::WIRE_QUANTIZATION_NONE, 0),
            32 * 2048 * 2);
}

TEST(WireSize, QuantizedRowsCarryCodesAndAScaleAndOffsetPerGroup) {
  // 2048 columns, groups of 128: 16 groups of 8 bytes, then the codes.
  EXPECT_EQ(StreamedTensorWireBytes({32, 2048}, v1::DTYPE_F32,
                                    v1::WIRE_QUANTIZATION_INT8, 0),
            32 * (16 * 8 + 2048));
  EXPECT_EQ(StreamedTensorWireBytes({32, 2048}, v1::DTYPE_F32,
                                    v1::WIRE_QUANTIZATION_INT4, 0),
            32 * (16 * 8 + 1024));
  // 10 columns, groups of 4 (4 + 4 + 2): 3 groups; 5 bytes of 4-bit codes.
  EXPECT_EQ(StreamedTensorWireBytes({3, 10}, v1::DTYPE_F32,
                                    v1::WIRE_QUANTIZATION_INT4, 4),
            3 * (3 * 8 + 5));
  // An odd row of 4-bit codes is padded to a whole byte.
  EXPECT_EQ(QuantizedRowBytes(7, 4, 7), 8 + 4);
  // A group size above the row length means the row.
  EXPECT_EQ(EffectiveWireGroupSize(4096, 100), 100);
  EXPECT_EQ(EffectiveWireGroupSize(0, 1000), kDefaultWireGroupSize);
  // A [B, T, dim] activation is B * T rows of dim.
  EXPECT_EQ(StreamedTensorWireBytes({2, 3, 64}, v1::DTYPE_F32,
                                    v1::WIRE_QUANTIZATION_INT8, 0),
            6 * (8 + 64));
}

TEST(WireSize, UnknownFormatsAreMinusOne) {
  EXPECT_EQ(StreamedTensorWireBytes({4}, static_cast<v1::DType>(99),
                                    v1::WIRE_QUANTIZATION_NONE, 0),
            -1);
  EXPECT_EQ(StreamedTensorWireBytes({4}, v1::DTYPE_F32,
                                    static_cast<v1::WireQuantization>(7), 0),
            -1);
}

}  // namespace
}  // namespace pipetrain
