// Group-wise int8 / int4 quantization of float32 rows: the wire format of
// streamed activations and gradients under a job's WireCompression.
//
// A tensor is `rows` rows of `cols` elements (its last dimension). Each row
// is cut into groups of `group_size` consecutive elements (the last group
// of a row may be shorter). A group has a float32 scale and a float32
// offset, its minimum (asymmetric min/max quantization); an element's code
// is an unsigned integer of `bits` bits (8 or 4) and it decodes to
//   offset + code * scale,   scale = (max - min) / (2^bits - 1).
// A constant group (max == min) has scale 0 and every code 0; so has a
// group whose range is under levels * FLT_MIN (values about 3e-36 apart at
// most, so its scale would not be a normal float): it decodes to its
// minimum, within that range.
//
// Byte layout of one row (rows follow each other with no gap; a row's
// byte count is spec/wire_size.h's QuantizedRowBytes, a tensor's is
// StreamedTensorWireBytes):
//   1. the row's group headers, group by group: scale then offset, each a
//      little-endian IEEE float32 (8 bytes per group);
//   2. the row's codes, element by element: int8 one byte per code; int4
//      two codes per byte, the even element in the low nibble and the odd
//      one in the high nibble, the row's last byte padded with a zero high
//      nibble when `cols` is odd.
// Headers first, per row, make every row self-contained: a receiver can
// decode a row as soon as its bytes are in, whatever frame they came in.
//
// Rounding: nearest (|decoded - x| <= scale / 2) or stochastic (code =
// floor((x - min) / scale + u), u uniform in [0, 1): the decoded value is
// unbiased, E[decoded] = x). The uniforms come from a counter-based hash
// of `seed` and the element's index, so a (seed, tensor) pair always
// encodes to the same bytes; the wire codec derives the seed from the job,
// the sending stage, the step and the micro-batch.
//
// Error feedback: with a `residual` buffer (same element count as the
// input), the quantizer encodes x + residual and leaves in `residual` the
// quantization error of what it encoded, (x + residual) - decoded, for the
// caller to add to its next message.
//
// Input must be finite: NaN or Inf fails with InvalidArgument (a group's
// scale would be NaN and every element of it garbage). Groups are encoded
// one at a time, both passes while the group is in cache, so after an
// error `dst` and `residual` hold a partial result: the caller drops the
// message and resets its residual. Thread-safe (pure functions).
#ifndef PIPETRAIN_SERVICES_WIRE_QUANTIZE_H_
#define PIPETRAIN_SERVICES_WIRE_QUANTIZE_H_

#include <cstdint>

#include "absl/status/status.h"

namespace pipetrain {

struct QuantizeOptions {
  int bits = 8;  // 8 or 4
  // Elements per group: an effective size (spec/wire_size.h's
  // EffectiveWireGroupSize), 1 to cols.
  int64_t group_size = 128;
  bool stochastic = false;
  uint64_t seed = 0;  // stochastic rounding only
};

// Encodes `rows` x `cols` floats at `src` into `dst`, which must hold
// rows * QuantizedRowBytes(cols, bits, group_size) bytes (any alignment).
// `residual` (nullable, rows * cols floats): added to the input before
// encoding and replaced by the new quantization error. InvalidArgument for
// non-finite input, a group whose range (max - min) overflows float32, or
// bad options.
// Two passes per group: min/max, then encode.
absl::Status QuantizeRows(const float* src, int64_t rows, int64_t cols,
                          const QuantizeOptions& options, uint8_t* dst,
                          float* residual = nullptr);

// Decodes `rows` rows of `cols` elements at `src` (any alignment) into the
// float32 elements at `dst`. Any bytes decode to some floats: the byte
// count is the caller's to check.
void DequantizeRows(const uint8_t* src, int64_t rows, int64_t cols, int bits,
                    int64_t group_size, float* dst);

// A well-mixed 64-bit seed from a base and three values (splitmix64):
// what the codec hands QuantizeOptions::seed for one message.
uint64_t MixSeed(uint64_t base, uint64_t a, uint64_t b, uint64_t c);

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_WIRE_QUANTIZE_H_
