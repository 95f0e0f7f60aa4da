// The shape rules of model specs, compute-free: what every layer kind
// requires of its input and what it outputs, per sample. The scheduler,
// the CLI and the worker validate a ModelSpec here before anything is
// built or sent.
#ifndef PIPETRAIN_SPEC_MODEL_SPEC_H_
#define PIPETRAIN_SPEC_MODEL_SPEC_H_

#include <vector>

#include "absl/status/statusor.h"
#include "common/shape.h"
#include "pipetrain/v1/model.pb.h"

namespace pipetrain {

// Checks a spec and returns the per-sample shape after every layer
// (element 0 is the input shape, element i + 1 the output of layer i).
// Errors are InvalidArgument naming the layer index and field, e.g.
// "layers[2].linear.in_features: 512 does not match the input's last
// dimension 256".
absl::StatusOr<std::vector<Shape>> ValidateModelSpec(const v1::ModelSpec& spec);

}  // namespace pipetrain

#endif  // PIPETRAIN_SPEC_MODEL_SPEC_H_
