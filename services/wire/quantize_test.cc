#include "services/wire/quantize.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "spec/wire_size.h"

namespace pipetrain {
namespace {

// The reference: the layout of quantize.h read byte by byte, one element
// at a time, with the group's range recomputed from the input in double.
struct Reference {
  std::vector<double> decoded;
  std::vector<double> scales;      // per element, of its group
  std::vector<double> magnitudes;  // |offset| + |code * scale|
};

float FloatAt(const std::vector<uint8_t>& bytes, size_t at) {
  float v;
  std::memcpy(&v, bytes.data() + at, 4);
  return v;
}

Reference Decode(const std::vector<uint8_t>& bytes, int64_t rows, int64_t cols,
                 int bits, int64_t group) {
  Reference ref;
  const int64_t groups = (cols + group - 1) / group;
  const int64_t row_bytes = groups * 8 + (cols * bits + 7) / 8;
  for (int64_t r = 0; r < rows; ++r) {
    const size_t row = static_cast<size_t>(r * row_bytes);
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t k = c / group;
      const double scale = FloatAt(bytes, row + k * 8);
      const double offset = FloatAt(bytes, row + k * 8 + 4);
      const size_t codes = row + groups * 8;
      int code;
      if (bits == 8) {
        code = bytes[codes + c];
      } else {
        const uint8_t b = bytes[codes + c / 2];
        code = c % 2 == 0 ? (b & 0xf) : (b >> 4);
      }
      ref.decoded.push_back(offset + code * scale);
      ref.scales.push_back(scale);
      ref.magnitudes.push_back(std::fabs(offset) + std::fabs(code * scale));
    }
  }
  return ref;
}

std::vector<float> Random(int64_t n, uint32_t seed, float spread = 3.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.5f, spread);
  std::vector<float> out(static_cast<size_t>(n));
  for (float& v : out) v = dist(gen);
  return out;
}

std::vector<uint8_t> Encode(const std::vector<float>& x, int64_t rows,
                            int64_t cols, const QuantizeOptions& o,
                            float* residual = nullptr) {
  std::vector<uint8_t> bytes(static_cast<size_t>(
      rows * QuantizedRowBytes(cols, o.bits, o.group_size)));
  const absl::Status s =
      QuantizeRows(x.data(), rows, cols, o, bytes.data(), residual);
  EXPECT_TRUE(s.ok()) << s;
  return bytes;
}

struct Case {
  int64_t rows, cols;
  int32_t group;  // as WireCompression gives it (0: default)
};

// Nearest rounding: every element within half its group's scale of the
// input, the scale the group's (max - min) / (2^bits - 1), the byte count
// spec/wire_size's, and DequantizeRows equal to the reference decoding.
TEST(Quantize, NearestRoundTripsWithinHalfAScale) {
  const Case cases[] = {{3, 256, 0},  {4, 300, 128}, {2, 7, 3},  {5, 1, 0},
                        {1, 33, 512}, {2, 129, 128}, {3, 10, 1}, {1, 8, 4}};
  for (int bits : {8, 4}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::Message()
                   << "bits " << bits << " rows " << c.rows << " cols "
                   << c.cols << " group " << c.group);
      const int64_t group = EffectiveWireGroupSize(c.group, c.cols);
      QuantizeOptions o;
      o.bits = bits;
      o.group_size = group;
      const std::vector<float> x = Random(c.rows * c.cols, 7);
      const std::vector<uint8_t> bytes = Encode(x, c.rows, c.cols, o);
      EXPECT_EQ(static_cast<int64_t>(bytes.size()),
                StreamedTensorWireBytes({c.rows, c.cols}, v1::DTYPE_F32,
                                        bits == 8 ? v1::WIRE_QUANTIZATION_INT8
                                                  : v1::WIRE_QUANTIZATION_INT4,
                                        c.group));
      const Reference ref = Decode(bytes, c.rows, c.cols, bits, group);
      std::vector<float> decoded(x.size());
      DequantizeRows(bytes.data(), c.rows, c.cols, bits, group, decoded.data());
      const int levels = (1 << bits) - 1;
      for (size_t i = 0; i < x.size(); ++i) {
        // The group's range, independently.
        const int64_t row = static_cast<int64_t>(i) / c.cols;
        const int64_t g0 = (static_cast<int64_t>(i) % c.cols) / group * group;
        double lo = 1e30, hi = -1e30;
        for (int64_t j = g0; j < std::min(c.cols, g0 + group); ++j) {
          lo = std::min<double>(lo, x[row * c.cols + j]);
          hi = std::max<double>(hi, x[row * c.cols + j]);
        }
        const double scale = (hi - lo) / levels;
        ASSERT_NEAR(ref.scales[i], scale, 1e-6 * scale + 1e-30) << i;
        ASSERT_LE(std::fabs(ref.decoded[i] - x[i]), scale / 2 * (1 + 1e-4))
            << "element " << i << " beyond half a scale (" << scale << ")";
        // float32 arithmetic: two roundings of the terms' magnitude.
        ASSERT_NEAR(decoded[i], ref.decoded[i], 2.5e-7 * ref.magnitudes[i])
            << i;
      }
    }
  }
}

// Stochastic rounding is unbiased: elements sitting 0.3 of a step above a
// code decode, on average over 200k of them, to themselves within 0.01 of
// a step (the mean's standard deviation is 0.001 steps; nearest rounding
// would be 0.3 steps low, a floor 0.3 low, a ceiling 0.7 high). Each
// element rounds to one of its two neighbouring codes.
TEST(Quantize, StochasticRoundingIsUnbiased) {
  for (int bits : {8, 4}) {
    SCOPED_TRACE(bits);
    const int levels = (1 << bits) - 1;
    const int64_t cols = 64, rows = 200000 / cols;
    // Each group spans [0, levels] (scale 1): element 0 is 0, element 1
    // is `levels`, the rest k + 0.3.
    std::vector<float> x(static_cast<size_t>(rows * cols));
    for (int64_t i = 0; i < rows * cols; ++i) {
      const int64_t c = i % cols;
      x[i] = c == 0   ? 0.0f
             : c == 1 ? static_cast<float>(levels)
                      : static_cast<float>(c % levels) + 0.3f;
    }
    QuantizeOptions o;
    o.bits = bits;
    o.group_size = cols;
    o.stochastic = true;
    o.seed = 42;
    const std::vector<uint8_t> bytes = Encode(x, rows, cols, o);
    std::vector<float> decoded(x.size());
    DequantizeRows(bytes.data(), rows, cols, bits, cols, decoded.data());
    double sum_error = 0;
    int64_t n = 0, up = 0;
    for (int64_t i = 0; i < rows * cols; ++i) {
      if (i % cols < 2) continue;
      const double e = static_cast<double>(decoded[i]) - x[i];
      ASSERT_TRUE(std::fabs(e + 0.3) < 1e-4 || std::fabs(e - 0.7) < 1e-4)
          << "element " << i << " rounded to neither neighbour: " << e;
      up += e > 0;
      sum_error += e;
      ++n;
    }
    EXPECT_NEAR(sum_error / n, 0.0, 0.01) << "mean error in steps";
    EXPECT_NEAR(static_cast<double>(up) / n, 0.3, 0.01) << "share rounded up";
    // Reproducible: the same seed, the same bytes; another, others.
    EXPECT_EQ(Encode(x, rows, cols, o), bytes);
    o.seed = 43;
    EXPECT_NE(Encode(x, rows, cols, o), bytes);
  }
}

// A constant group (max == min) has scale 0 and decodes exactly, whatever
// its neighbours hold (each group has its own range); so does a group of
// one (the row's short last group).
TEST(Quantize, ConstantGroupsDecodeExactly) {
  for (int bits : {8, 4}) {
    std::vector<float> x = {2.5f, 2.5f, 2.5f, -1.0f, -1.0f, -1.0f, 7.0f};
    QuantizeOptions o;
    o.bits = bits;
    o.group_size = 3;
    std::vector<float> residual(x.size(), 0.0f);
    const std::vector<uint8_t> bytes = Encode(x, 1, 7, o, residual.data());
    EXPECT_EQ(FloatAt(bytes, 0), 0.0f);  // group 0's scale
    EXPECT_EQ(FloatAt(bytes, 4), 2.5f);  // and offset
    std::vector<float> decoded(x.size());
    DequantizeRows(bytes.data(), 1, 7, bits, 3, decoded.data());
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(decoded[i], x[i]) << i;
      EXPECT_EQ(residual[i], 0.0f) << i;
    }
  }
}

// A group whose values lie less than levels * FLT_MIN apart (about 3e-36
// for int8) would need a scale below float32's smallest normal, whose
// inverse overflows: it encodes as a constant at its minimum. Its error is
// under that range (not half a step), finite, and carried by the residual.
// (The frame decoder fuzzer found such a group: a subnormal beside zeros.)
TEST(Quantize, AGroupTooNarrowForANormalScaleEncodesAsItsMinimum) {
  for (int bits : {8, 4}) {
    const float levels = static_cast<float>((1 << bits) - 1);
    const std::vector<float> x = {
        1.65329397e-40f, 0.0f, 0.0f, 0.0f, 3.0f, -1.0f};
    QuantizeOptions o;
    o.bits = bits;
    o.group_size = 3;
    std::vector<float> residual(x.size(), 0.0f);
    const std::vector<uint8_t> bytes = Encode(x, 1, 6, o, residual.data());
    EXPECT_EQ(FloatAt(bytes, 0), 0.0f);  // group 0: scale 0, offset 0
    EXPECT_EQ(FloatAt(bytes, 4), 0.0f);
    std::vector<float> decoded(x.size());
    DequantizeRows(bytes.data(), 1, 6, bits, 3, decoded.data());
    EXPECT_EQ(decoded[0], 0.0f);
    EXPECT_LT(std::fabs(decoded[0] - x[0]), levels * FLT_MIN);
    EXPECT_EQ(residual[0], x[0]);  // the error goes into the next message
    // The next group has its own range and meets the half-step bound.
    const double step = 4.0 / levels;
    for (size_t i = 3; i < x.size(); ++i) {
      EXPECT_LE(std::fabs(decoded[i] - x[i]), 0.5 * step * 1.0001) << i;
    }
  }
}

// Odd row lengths under int4: the last code of a row sits in the low
// nibble of the row's last byte and the padding nibble is zero; the next
// row starts on a fresh byte.
TEST(Quantize, Int4OddRowsArePaddedToAByte) {
  const std::vector<float> x = {0, 1, 2.2f, 3, 4, 15, 14, 13, 12, 11};
  QuantizeOptions o;
  o.bits = 4;
  o.group_size = 5;
  const std::vector<uint8_t> bytes = Encode(x, 2, 5, o);
  ASSERT_EQ(bytes.size(), 2u * (8 + 3));
  // Row 0: scale 4/15, codes 0, 3.75 -> 4, 8.25 -> 8, 11.25 -> 11, 15.
  EXPECT_EQ(bytes[8], 0x40);                 // codes 0 and 4 (3.75 rounds to 4)
  EXPECT_EQ(bytes[9], 0xb8);                 // codes 8 and 11
  EXPECT_EQ(bytes[10], 0x0f);                // code 15, padding 0
  EXPECT_EQ(FloatAt(bytes, 11 + 4), 11.0f);  // row 1's offset
  std::vector<float> decoded(x.size());
  DequantizeRows(bytes.data(), 2, 5, 4, 5, decoded.data());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(decoded[i], x[i], 4.0 / 15 / 2 + 1e-6) << i;
  }
}

// NaN and Inf are refused with a clear error, not sent as garbage.
TEST(Quantize, NonFiniteInputIsRejected) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> x(300, 1.0f);
    x[257] = bad;
    std::vector<uint8_t> bytes(3 * 8 + 300);
    QuantizeOptions o;
    const absl::Status s =
        QuantizeRows(x.data(), 1, 300, o, bytes.data(), nullptr);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find("NaN or Inf"), std::string::npos) << s;
  }
  // Finite values whose range (max - min) overflows float32.
  std::vector<float> x = {-3e38f, 3e38f};
  std::vector<uint8_t> bytes(8 + 2);
  QuantizeOptions o;
  o.group_size = 2;
  EXPECT_TRUE(absl::IsInvalidArgument(
      QuantizeRows(x.data(), 1, 2, o, bytes.data(), nullptr)));
  o.bits = 5;
  EXPECT_TRUE(absl::IsInvalidArgument(
      QuantizeRows(x.data(), 1, 2, o, bytes.data(), nullptr)));
}

// With a residual, the quantizer encodes x + residual and leaves the new
// error (x + residual) - decoded in it.
TEST(Quantize, ResidualIsAddedAndReplacedByTheNewError) {
  for (int bits : {8, 4}) {
    const int64_t rows = 3, cols = 50;
    const std::vector<float> x = Random(rows * cols, 3);
    std::vector<float> residual = Random(rows * cols, 4, 0.1f);
    const std::vector<float> before = residual;
    QuantizeOptions o;
    o.bits = bits;
    o.group_size = 16;
    const std::vector<uint8_t> bytes =
        Encode(x, rows, cols, o, residual.data());
    std::vector<float> decoded(x.size());
    DequantizeRows(bytes.data(), rows, cols, bits, 16, decoded.data());
    for (size_t i = 0; i < x.size(); ++i) {
      const float sent = x[i] + before[i];
      EXPECT_NEAR(residual[i], sent - decoded[i], 1e-6) << i;
    }
  }
}

}  // namespace
}  // namespace pipetrain
