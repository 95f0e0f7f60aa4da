// The byte layout of a stage message's frames, shared by the encoder
// (frame_codec.cc) and the assembler (frame_assembler.cc). Internal to the
// wire codec: users include frame_codec.h.
#ifndef PIPETRAIN_SERVICES_WIRE_FRAME_LAYOUT_H_
#define PIPETRAIN_SERVICES_WIRE_FRAME_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "pipetrain/v1/stage.pb.h"
#include "worker/pipeline/mailbox.h"

namespace pipetrain {
namespace wire_internal {

// Every tensor of a payload starts at a multiple of this many bytes, and
// every frame but a message's last ends on one.
inline constexpr int64_t kAlign = 8;

inline int64_t AlignUp(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Whether tensor `index` of a `kind` message is its payload (the
// activation or gradient itself), which travels in the wire dtype; any
// other travels as exact float32 (none do today: labels stay with the last
// stage, which reads them itself).
inline bool IsPayloadTensor(MessageKind kind, size_t index) {
  return index == 0 && (kind == MessageKind::kActivation ||
                        kind == MessageKind::kEvalActivation ||
                        kind == MessageKind::kGradient);
}

// Byte offsets of each tensor in the payload and the payload's size.
struct Layout {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  // A quantized tensor's dtype is float32, what it decodes to.
  std::vector<DType> dtypes;
  // Quantized tensors: code bits (0: not quantized), rows, elements per
  // row, the group size and the bytes of a row.
  struct Quantized {
    int bits = 0;
    int64_t rows = 0;
    int64_t cols = 0;
    int64_t group = 1;
    int64_t row_bytes = 0;
  };
  std::vector<Quantized> quantized;
  int64_t total = 0;
};

// The quantization a wire dtype stands for (NONE for f32, bf16, f16).
v1::WireQuantization QuantizationOf(v1::DType dtype);

// The wire dtype of quantization `q` (INT8 or INT4).
v1::DType QuantizedDType(v1::WireQuantization q);

// The elements per row of a tensor of `shape` (its last dimension; a
// scalar is one row of one).
template <typename Dims>
int64_t RowLength(const Dims& shape) {
  return shape.empty() ? 1 : *(shape.end() - 1);
}

// The layout of the header's tensors; with `as_f32`, of the same tensors
// widened to float32 (what the decoder assembles).
absl::StatusOr<Layout> LayoutOf(const v1::FrameHeader& header,
                                bool as_f32 = false);

}  // namespace wire_internal
}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_WIRE_FRAME_LAYOUT_H_
