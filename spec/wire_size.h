// The size of a streamed activation or gradient on the wire, for every
// wire format: what the planner's cost model charges a link with, and what
// the wire codec (services/wire) must produce byte for byte.
//
// A tensor of shape [d0, ..., dn-1] is `rows` = d0 * ... * dn-2 rows of
// `cols` = dn-1 elements (a 1-D tensor is one row).
//   f32 / bf16 / f16: rows * cols * 4 / 2 / 2 bytes.
//   int8 / int4 (WireCompression): each row is cut into groups of
//     `group_size` consecutive elements (the last may be shorter); a group
//     carries a float32 scale and a float32 offset (8 bytes) and one code
//     per element, 8 bits (int8) or 4 bits (int4, two codes a byte, a row's
//     codes padded to a whole byte). An element is offset + code * scale.
#ifndef PIPETRAIN_SPEC_WIRE_SIZE_H_
#define PIPETRAIN_SPEC_WIRE_SIZE_H_

#include <cstdint>
#include <vector>

#include "pipetrain/v1/job.pb.h"
#include "pipetrain/v1/tensor.pb.h"

namespace pipetrain {

// Elements per scale when WireCompression.group_size is 0.
inline constexpr int32_t kDefaultWireGroupSize = 128;
// Bytes of a group's scale and offset.
inline constexpr int64_t kWireGroupHeaderBytes = 8;

// The group size in force for rows of `cols` elements: `requested` (0: the
// default), at most `cols` (and at least 1).
int64_t EffectiveWireGroupSize(int32_t requested, int64_t cols);

// Code bits of a quantization (8, 4), 0 for WIRE_QUANTIZATION_NONE.
int WireQuantizationBits(v1::WireQuantization quantization);

// Bytes of one row of `cols` elements quantized to `bits` with groups of
// `group_size` (an effective size, >= 1).
int64_t QuantizedRowBytes(int64_t cols, int bits, int64_t group_size);

// Bytes a streamed tensor of `shape` takes on the wire: quantized per
// `quantization` (with `group_size` as WireCompression gives it) unless
// that is NONE, else in `wire_dtype`. -1 for an unknown dtype or
// quantization.
int64_t StreamedTensorWireBytes(const std::vector<int64_t>& shape,
                                v1::DType wire_dtype,
                                v1::WireQuantization quantization,
                                int32_t group_size);

// The quantization a job's compression applies to activations (gradient =
// false) or gradients (gradient = true).
inline v1::WireQuantization DirectionQuantization(
    const v1::WireCompression& compression, bool gradient) {
  return gradient ? compression.gradients() : compression.activations();
}

}  // namespace pipetrain

#endif  // PIPETRAIN_SPEC_WIRE_SIZE_H_
