// Tensor shapes as plain values: what the compute core, the spec rules and
// the wire all describe tensors with.
#ifndef PIPETRAIN_COMMON_SHAPE_H_
#define PIPETRAIN_COMMON_SHAPE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pipetrain {

using Shape = std::vector<int64_t>;

// The product of the dimensions (1 for a scalar's empty shape).
int64_t NumElements(const Shape& shape);
// a * b, or nullopt when either is negative or the product overflows
// int64: the one overflow-checked multiplication sizes are computed with.
std::optional<int64_t> CheckedMul(int64_t a, int64_t b);
// NumElements, or nullopt for a negative dimension or an overflow.
std::optional<int64_t> CheckedNumElements(const Shape& shape);
// "[2, 3]".
std::string ShapeToString(const Shape& shape);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_SHAPE_H_
