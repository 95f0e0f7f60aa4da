// The element types tensors are stored in. Compute runs in float32; bf16
// and fp16 exist as wire formats. Their names and wire (proto) values are
// converted in one place, spec/vocabulary.h.
#ifndef PIPETRAIN_COMMON_DTYPE_H_
#define PIPETRAIN_COMMON_DTYPE_H_

#include <cstddef>

namespace pipetrain {

enum class DType { kF32 = 0, kBF16 = 1, kF16 = 2 };

// Bytes per element.
constexpr size_t DTypeSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_DTYPE_H_
