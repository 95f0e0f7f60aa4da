#include "spec/wire_size.h"

#include <algorithm>

namespace pipetrain {

int64_t EffectiveWireGroupSize(int32_t requested, int64_t cols) {
  const int64_t g = requested > 0 ? requested : kDefaultWireGroupSize;
  return std::max<int64_t>(1, std::min<int64_t>(g, cols));
}

int WireQuantizationBits(v1::WireQuantization quantization) {
  switch (quantization) {
    case v1::WIRE_QUANTIZATION_INT8:
      return 8;
    case v1::WIRE_QUANTIZATION_INT4:
      return 4;
    default:
      return 0;
  }
}

int64_t QuantizedRowBytes(int64_t cols, int bits, int64_t group_size) {
  if (cols <= 0) return 0;
  const int64_t groups = (cols + group_size - 1) / group_size;
  const int64_t codes = (cols * bits + 7) / 8;
  return groups * kWireGroupHeaderBytes + codes;
}

int64_t StreamedTensorWireBytes(const std::vector<int64_t>& shape,
                                v1::DType wire_dtype,
                                v1::WireQuantization quantization,
                                int32_t group_size) {
  int64_t elements = 1;
  for (int64_t d : shape) elements *= d;
  if (quantization != v1::WIRE_QUANTIZATION_NONE) {
    const int bits = WireQuantizationBits(quantization);
    if (bits == 0) return -1;
    const int64_t cols = shape.empty() ? 1 : shape.back();
    if (cols == 0 || elements == 0) return 0;
    const int64_t rows = elements / cols;
    return rows * QuantizedRowBytes(cols, bits,
                                    EffectiveWireGroupSize(group_size, cols));
  }
  switch (wire_dtype) {
    case v1::DTYPE_F32:
      return elements * 4;
    case v1::DTYPE_BF16:
    case v1::DTYPE_F16:
      return elements * 2;
    default:
      return -1;
  }
}

}  // namespace pipetrain
