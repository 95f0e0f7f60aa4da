// A named tensor of a stage's state as checkpoints and exports hold it,
// and the naming rules of proto/pipetrain/v1/stage.proto:
//   layers.{i}.{param}                    a parameter of model layer i
//   optimizer.layers.{i}.{param}.{slot}   the optimizer's state for it
// Data is float32 little-endian, shape as in the checkpoint layout (a
// linear weight is [out, in]).
#ifndef PIPETRAIN_SCHEDULER_STATE_TENSOR_H_
#define PIPETRAIN_SCHEDULER_STATE_TENSOR_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace pipetrain {

struct StateTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::string data;  // f32 little-endian, product(shape) * 4 bytes

  bool operator==(const StateTensor& o) const {
    return name == o.name && shape == o.shape && data == o.data;
  }
};

inline constexpr absl::string_view kParameterPrefix = "layers.";
inline constexpr absl::string_view kOptimizerPrefix = "optimizer.layers.";

// True for a model parameter (not optimizer state).
bool IsParameterName(absl::string_view name);

// The model layer a state tensor belongs to, or nullopt when the name does
// not follow the naming above.
std::optional<int> LayerOfStateTensor(absl::string_view name);

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_STATE_TENSOR_H_
