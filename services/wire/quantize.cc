#include "services/wire/quantize.h"

#include <algorithm>
#include <cfloat>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spec/wire_size.h"

namespace pipetrain {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the wire's float32 headers are little-endian");

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A uniform in [0, 1) for element `index` of a message seeded `seed`: 24
// random bits, so u + integer part is exact in float32 for codes < 2^8.
inline float Uniform(uint64_t seed, uint64_t index) {
  return static_cast<float>(SplitMix(seed ^ (index * 0xd1b54a32d192ed03ull)) >>
                            40) *
         (1.0f / 16777216.0f);
}

// The element `i` of a group: the input plus the carried error, if any.
inline float Value(const float* src, const float* residual, int64_t i) {
  return residual != nullptr ? src[i] + residual[i] : src[i];
}

struct GroupRange {
  float scale = 0.0f;
  float offset = 0.0f;
  float inverse = 0.0f;  // 1 / scale, 0 for a constant group
};

// Pass one: the group's min and max, and whether every element is finite
// (x * 0 is NaN exactly for NaN and Inf, and NaN sticks in the sum).
absl::Status RangeOf(const float* src, const float* residual, int64_t n,
                     int levels, GroupRange* range) {
  float lo = Value(src, residual, 0);
  float hi = lo;
  float poison = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = Value(src, residual, i);
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
    poison += v * 0.0f;
  }
  if (poison != 0.0f) {
    return absl::InvalidArgumentError(
        "cannot quantize a tensor holding NaN or Inf (the stage's "
        "activations or gradients diverged)");
  }
  const double span = static_cast<double>(hi) - lo;
  if (span > FLT_MAX) {  // x - offset would overflow to Inf
    return absl::InvalidArgumentError(
        absl::StrCat("cannot quantize values spanning [", lo, ", ", hi,
                     "]: the group's range overflows float32"));
  }
  const double scale = span / levels;
  range->offset = lo;
  // A range so small that 1 / scale would overflow encodes as a constant
  // (its error, below levels * FLT_MIN, is far under any float's ulp).
  range->scale = scale < FLT_MIN ? 0.0f : static_cast<float>(scale);
  range->inverse = range->scale == 0.0f ? 0.0f : 1.0f / range->scale;
  return absl::OkStatus();
}

// The code of value v: nearest, or floor(. + u) for stochastic rounding.
inline int Code(float v, const GroupRange& r, float u, int levels) {
  const int c = static_cast<int>((v - r.offset) * r.inverse + u);
  return c > levels ? levels : c;
}

// Pass two for one group: codes of 8 bits, written straight to `out`.
void EncodeGroup8(const float* src, float* residual, int64_t n,
                  const GroupRange& r, const QuantizeOptions& o,
                  uint64_t first_index, uint8_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = Value(src, residual, i);
    const float u = o.stochastic ? Uniform(o.seed, first_index + i) : 0.5f;
    const int c = Code(v, r, u, 255);
    out[i] = static_cast<uint8_t>(c);
    if (residual != nullptr) {
      residual[i] = v - (r.offset + static_cast<float>(c) * r.scale);
    }
  }
}

// Pass two for one group of 4-bit codes starting at column `col` of a row
// whose code bytes are `codes` (zeroed by the caller).
void EncodeGroup4(const float* src, float* residual, int64_t n,
                  const GroupRange& r, const QuantizeOptions& o,
                  uint64_t first_index, int64_t col, uint8_t* codes) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = Value(src, residual, i);
    const float u = o.stochastic ? Uniform(o.seed, first_index + i) : 0.5f;
    const int c = Code(v, r, u, 15);
    const int64_t at = col + i;
    codes[at >> 1] |= static_cast<uint8_t>(c << ((at & 1) * 4));
    if (residual != nullptr) {
      residual[i] = v - (r.offset + static_cast<float>(c) * r.scale);
    }
  }
}

void PutFloat(uint8_t* p, float v) { std::memcpy(p, &v, sizeof(v)); }
float GetFloat(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

}  // namespace

uint64_t MixSeed(uint64_t base, uint64_t a, uint64_t b, uint64_t c) {
  return SplitMix(SplitMix(SplitMix(base ^ a) ^ b) ^ c);
}

absl::Status QuantizeRows(const float* src, int64_t rows, int64_t cols,
                          const QuantizeOptions& o, uint8_t* dst,
                          float* residual) {
  if ((o.bits != 8 && o.bits != 4) || o.group_size < 1 ||
      (cols > 0 && o.group_size > cols) || rows < 0 || cols < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("quantize: bits ", o.bits, " (8 or 4), group size ",
                     o.group_size, " (1 to the row's ", cols, " elements)"));
  }
  const int levels = (1 << o.bits) - 1;
  const int64_t g = o.group_size;
  const int64_t groups = (cols + g - 1) / g;
  const int64_t row_bytes = QuantizedRowBytes(cols, o.bits, g);
  // Group by group, both passes while the group is in cache.
  for (int64_t row = 0; row < rows; ++row) {
    uint8_t* out = dst + row * row_bytes;
    uint8_t* codes = out + groups * kWireGroupHeaderBytes;
    if (o.bits == 4) std::memset(codes, 0, (cols + 1) / 2);
    for (int64_t k = 0; k < groups; ++k) {
      const int64_t col = k * g;
      const int64_t at = row * cols + col;
      const int64_t n = std::min(g, cols - col);
      float* res = residual != nullptr ? residual + at : nullptr;
      GroupRange r;
      RETURN_IF_ERROR(RangeOf(src + at, res, n, levels, &r));
      PutFloat(out + k * kWireGroupHeaderBytes, r.scale);
      PutFloat(out + k * kWireGroupHeaderBytes + 4, r.offset);
      if (o.bits == 8) {
        EncodeGroup8(src + at, res, n, r, o, static_cast<uint64_t>(at),
                     codes + col);
      } else {
        EncodeGroup4(src + at, res, n, r, o, static_cast<uint64_t>(at), col,
                     codes);
      }
    }
  }
  return absl::OkStatus();
}

void DequantizeRows(const uint8_t* src, int64_t rows, int64_t cols, int bits,
                    int64_t group_size, float* dst) {
  const int64_t g = group_size;
  const int64_t groups = (cols + g - 1) / g;
  const int64_t row_bytes = QuantizedRowBytes(cols, bits, g);
  for (int64_t row = 0; row < rows; ++row) {
    const uint8_t* in = src + row * row_bytes;
    const uint8_t* codes = in + groups * kWireGroupHeaderBytes;
    float* out = dst + row * cols;
    for (int64_t k = 0; k < groups; ++k) {
      const float scale = GetFloat(in + k * kWireGroupHeaderBytes);
      const float offset = GetFloat(in + k * kWireGroupHeaderBytes + 4);
      const int64_t begin = k * g;
      const int64_t end = std::min(cols, begin + g);
      if (bits == 8) {
        for (int64_t i = begin; i < end; ++i) {
          out[i] = offset + static_cast<float>(codes[i]) * scale;
        }
        continue;
      }
      int64_t i = begin;
      if (i & 1) {  // the group starts in a byte's high nibble
        out[i] = offset + static_cast<float>(codes[i >> 1] >> 4) * scale;
        ++i;
      }
      for (; i + 1 < end; i += 2) {
        const uint8_t b = codes[i >> 1];
        out[i] = offset + static_cast<float>(b & 15) * scale;
        out[i + 1] = offset + static_cast<float>(b >> 4) * scale;
      }
      if (i < end)
        out[i] = offset + static_cast<float>(codes[i >> 1] & 15) * scale;
    }
  }
}

}  // namespace pipetrain
