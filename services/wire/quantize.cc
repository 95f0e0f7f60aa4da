#include "services/wire/quantize.h"

#include <algorithm>
#include <cfloat>
#include <cstring>
#include <vector>

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
// (v - v is 0 exactly for finite v). Eight independent lanes let the
// compiler keep the loop in vector registers (one dependency chain per
// lane instead of one per group).
absl::Status RangeOf(const float* src, const float* residual, int64_t n,
                     int levels, GroupRange* range) {
  constexpr int kLanes = 8;
  float lo[kLanes], hi[kLanes];
  int finite[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    lo[l] = hi[l] = Value(src, residual, 0);
    finite[l] = 1;
  }
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const float v = Value(src, residual, i + l);
      lo[l] = v < lo[l] ? v : lo[l];
      hi[l] = v > hi[l] ? v : hi[l];
      finite[l] &= (v - v == 0.0f);
    }
  }
  for (; i < n; ++i) {
    const float v = Value(src, residual, i);
    lo[0] = v < lo[0] ? v : lo[0];
    hi[0] = v > hi[0] ? v : hi[0];
    finite[0] &= (v - v == 0.0f);
  }
  for (int l = 1; l < kLanes; ++l) {
    lo[0] = lo[l] < lo[0] ? lo[l] : lo[0];
    hi[0] = hi[l] > hi[0] ? hi[l] : hi[0];
    finite[0] &= finite[l];
  }
  if (!finite[0]) {
    return absl::InvalidArgumentError(
        "cannot quantize a tensor holding NaN or Inf (the stage's "
        "activations or gradients diverged)");
  }
  const float lo_all = lo[0], hi_all = hi[0];
  const double span = static_cast<double>(hi_all) - lo_all;
  if (span > FLT_MAX) {  // x - offset would overflow to Inf
    return absl::InvalidArgumentError(
        absl::StrCat("cannot quantize values spanning [", lo_all, ", ", hi_all,
                     "]: the group's range overflows float32"));
  }
  const double scale = span / levels;
  range->offset = lo_all;
  // A range so small that the scale would fall below float32's smallest
  // normal (and 1 / scale overflow) encodes as a constant at its minimum:
  // the error is under the range, levels * FLT_MIN (about 3e-36).
  range->scale = scale < FLT_MIN ? 0.0f : static_cast<float>(scale);
  range->inverse = range->scale == 0.0f ? 0.0f : 1.0f / range->scale;
  return absl::OkStatus();
}

// Pass two for one group: the codes of its n elements into `codes` (one
// byte each), and the new residual where there is one. Specialized on the
// residual and the rounding so the nearest, residual-free loop (the
// activations' common case) vectorizes.
template <bool kResidual, bool kStochastic>
void EncodeCodes(const float* src, float* residual, int64_t n,
                 const GroupRange& r, uint64_t seed, uint64_t first_index,
                 int levels, uint8_t* codes) {
  const float offset = r.offset, inverse = r.inverse, scale = r.scale;
  for (int64_t i = 0; i < n; ++i) {
    const float v = kResidual ? src[i] + residual[i] : src[i];
    const float u = kStochastic ? Uniform(seed, first_index + i) : 0.5f;
    int c = static_cast<int>((v - offset) * inverse + u);
    c = c > levels ? levels : c;
    codes[i] = static_cast<uint8_t>(c);
    if (kResidual) residual[i] = v - (offset + static_cast<float>(c) * scale);
  }
}

void EncodeGroup(const float* src, float* residual, int64_t n,
                 const GroupRange& r, const QuantizeOptions& o,
                 uint64_t first_index, int levels, uint8_t* codes) {
  if (residual != nullptr) {
    if (o.stochastic) {
      EncodeCodes<true, true>(src, residual, n, r, o.seed, first_index, levels,
                              codes);
    } else {
      EncodeCodes<true, false>(src, residual, n, r, o.seed, first_index, levels,
                               codes);
    }
  } else if (o.stochastic) {
    EncodeCodes<false, true>(src, residual, n, r, o.seed, first_index, levels,
                             codes);
  } else {
    EncodeCodes<false, false>(src, residual, n, r, o.seed, first_index, levels,
                              codes);
  }
}

// Packs n 4-bit codes (one a byte in `codes`) starting at column `col`
// into a row's code bytes `packed` (zeroed by the caller).
void PackNibbles(const uint8_t* codes, int64_t n, int64_t col,
                 uint8_t* packed) {
  int64_t i = 0;
  if (col & 1) {  // the group starts in a byte's high nibble
    packed[col >> 1] |= static_cast<uint8_t>(codes[0] << 4);
    i = 1;
  }
  uint8_t* out = packed + ((col + i) >> 1);
  for (; i + 1 < n; i += 2) {
    *out++ = static_cast<uint8_t>(codes[i] | (codes[i + 1] << 4));
  }
  if (i < n) *out |= codes[i];
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
  // int4: a group's codes a byte each, before they are packed.
  std::vector<uint8_t> nibbles(o.bits == 4 ? static_cast<size_t>(g) : 0);
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
        EncodeGroup(src + at, res, n, r, o, static_cast<uint64_t>(at), levels,
                    codes + col);
      } else {
        uint8_t* scratch = nibbles.data();
        EncodeGroup(src + at, res, n, r, o, static_cast<uint64_t>(at), levels,
                    scratch);
        PackNibbles(scratch, n, col, codes);
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
