// The CUDA backend (cuBLAS + project kernels). No CUDA type appears here;
// everything CUDA-specific stays in this folder's .cu files.
#ifndef PIPETRAIN_WORKER_COMPUTE_CUDA_CUDA_BACKEND_H_
#define PIPETRAIN_WORKER_COMPUTE_CUDA_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/compute/backend.h"

namespace pipetrain {

// Number of usable CUDA devices; 0 when there is no driver or no device.
int CudaDeviceCount();

// A backend on CUDA device `device`. FailedPrecondition when it does not
// exist; errors from the driver name the failing call.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COMPUTE_CUDA_CUDA_BACKEND_H_
