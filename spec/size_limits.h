// The sizes a job may ask for, checked before anything is allocated: every
// dimension, per-sample shape and parameter tensor a spec implies is
// computed with overflow checks and held under fixed caps, and a job's
// least memory need (its parameters and its largest micro-batch activation)
// can be set against the workers' memory. Compute-free; the spec rules
// (model_spec, training_spec) and the scheduler use these, so the worker
// never sees a spec whose arithmetic wraps.
#ifndef PIPETRAIN_SPEC_SIZE_LIMITS_H_
#define PIPETRAIN_SPEC_SIZE_LIMITS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/shape.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain {

// One dimension of a shape or a layer's width.
inline constexpr int64_t kMaxDimension = int64_t{1} << 24;
// Elements of one tensor: a sample, a micro-batch's activation, one
// parameter (2^31 floats are 8 GiB).
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 31;
// Samples in one mini-batch.
inline constexpr int64_t kMaxBatchSize = int64_t{1} << 20;
inline constexpr int kMaxLayers = 4096;

// The elements of `shape` when every dimension is in [0, kMaxDimension]
// and the product at most kMaxTensorElements; InvalidArgument naming
// `what`, the shape and the limit otherwise.
absl::StatusOr<int64_t> CheckedElements(const Shape& shape,
                                        const std::string& what);

// The parameters (float32 elements) layer `layer` of a valid model holds;
// InvalidArgument when one of its tensors passes kMaxTensorElements.
absl::StatusOr<int64_t> LayerParameters(const v1::LayerSpec& layer);

// What a job needs at least, whatever the partition: its parameters with
// their gradients, and the largest activation of one micro-batch.
struct JobFootprint {
  int64_t parameters = 0;
  int64_t largest_activation_elements = 0;
  // 4 bytes * (2 * parameters + the activation): a lower bound of the
  // memory the pipeline's workers need together.
  int64_t min_bytes = 0;
};

// The footprint of a training spec that passed ValidateTrainingSpec.
absl::StatusOr<JobFootprint> EstimateFootprint(const v1::TrainingSpec& spec);

}  // namespace pipetrain

#endif  // PIPETRAIN_SPEC_SIZE_LIMITS_H_
