// Tensors as TensorProto messages (weights in unary calls, checkpoints):
// the one place that converts, so every reader applies the same checks.
// Streamed activations do not use this; see services/wire/.
#ifndef PIPETRAIN_WORKER_COMPUTE_TENSOR_PROTO_H_
#define PIPETRAIN_WORKER_COMPUTE_TENSOR_PROTO_H_

#include <string>

#include "absl/status/statusor.h"
#include "pipetrain/v1/tensor.pb.h"
#include "worker/compute/tensor.h"

namespace pipetrain {

// A copy of a host tensor as a TensorProto named `name`: its dtype, shape
// and little-endian bytes. InvalidArgument for an empty or device tensor.
absl::StatusOr<v1::TensorProto> TensorToProto(const std::string& name,
                                              const Tensor& host);

// A new host tensor holding a copy of the proto's data. InvalidArgument,
// naming the tensor, for an unknown dtype, a negative dimension, or data
// whose size is not the shape's element count times the dtype's size.
absl::StatusOr<Tensor> TensorFromProto(const v1::TensorProto& proto);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COMPUTE_TENSOR_PROTO_H_
