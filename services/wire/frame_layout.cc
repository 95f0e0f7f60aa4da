#include "services/wire/frame_layout.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/wire/frame_codec.h"
#include "spec/vocabulary.h"
#include "spec/wire_size.h"

namespace pipetrain {
namespace wire_internal {

v1::WireQuantization QuantizationOf(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_INT8:
      return v1::WIRE_QUANTIZATION_INT8;
    case v1::DTYPE_INT4:
      return v1::WIRE_QUANTIZATION_INT4;
    default:
      return v1::WIRE_QUANTIZATION_NONE;
  }
}

v1::DType QuantizedDType(v1::WireQuantization q) {
  return q == v1::WIRE_QUANTIZATION_INT8 ? v1::DTYPE_INT8 : v1::DTYPE_INT4;
}

// The layout of the header's tensors; with `as_f32`, of the same tensors
// widened to float32 (what the decoder assembles).
absl::StatusOr<Layout> LayoutOf(const v1::FrameHeader& header, bool as_f32) {
  Layout layout;
  for (const v1::TensorMeta& meta : header.tensors()) {
    const v1::WireQuantization q = QuantizationOf(meta.dtype());
    DType dtype = DType::kF32;
    if (q == v1::WIRE_QUANTIZATION_NONE) {
      ASSIGN_OR_RETURN(dtype, DTypeFromProto(meta.dtype()));
    }
    if (as_f32) dtype = DType::kF32;
    int64_t n = 1;
    for (int64_t d : meta.shape()) {
      if (d < 0 || d > kMaxMessageBytes) {
        return absl::InvalidArgumentError(absl::StrCat("bad dimension ", d));
      }
      n *= d;
      if (n > kMaxMessageBytes) {
        return absl::InvalidArgumentError("tensor too large");
      }
    }
    Layout::Quantized quantized;
    int64_t size = n * static_cast<int64_t>(DTypeSize(dtype));
    if (q != v1::WIRE_QUANTIZATION_NONE && !as_f32 && n > 0) {
      quantized.bits = WireQuantizationBits(q);
      quantized.cols = RowLength(meta.shape());
      quantized.rows = n / quantized.cols;
      if (meta.group_size() < 1 || meta.group_size() > quantized.cols) {
        return absl::InvalidArgumentError(absl::StrCat(
            "a quantized tensor's group size ", meta.group_size(),
            " is outside [1, ", quantized.cols, "] (its row length)"));
      }
      quantized.group = meta.group_size();
      quantized.row_bytes =
          QuantizedRowBytes(quantized.cols, quantized.bits, quantized.group);
      const std::vector<int64_t> shape(meta.shape().begin(),
                                       meta.shape().end());
      size =
          StreamedTensorWireBytes(shape, v1::DTYPE_F32, q, meta.group_size());
    } else if (q != v1::WIRE_QUANTIZATION_NONE && !as_f32) {
      size = 0;  // no elements
    }
    layout.total = AlignUp(layout.total);
    layout.offsets.push_back(layout.total);
    layout.sizes.push_back(size);
    layout.dtypes.push_back(dtype);
    layout.quantized.push_back(quantized);
    layout.total += layout.sizes.back();
  }
  return layout;
}

}  // namespace wire_internal
}  // namespace pipetrain
