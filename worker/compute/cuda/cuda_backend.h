// The CUDA backend (cuBLAS + project kernels). No CUDA type appears here;
// everything CUDA-specific stays in this folder's .cu files.
#ifndef PIPETRAIN_WORKER_COMPUTE_CUDA_CUDA_BACKEND_H_
#define PIPETRAIN_WORKER_COMPUTE_CUDA_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/compute/backend.h"

namespace pipetrain {

// Number of CUDA devices this process can use: 0 when the runtime reports
// none (cudaErrorNoDevice: none installed, or CUDA_VISIBLE_DEVICES hides
// them). Every other failure (no driver, a driver older than this runtime,
// a device that does not initialise) is returned as the CUDA error, named
// as in cuda_status.h, so that a broken GPU is never mistaken for a missing
// one. Callers that want a GPU only when one works (CreateBackend(kAuto))
// decide for themselves to fall back on an error.
absl::StatusOr<int> CudaDeviceCount();

// A backend on CUDA device `device`. FailedPrecondition when it does not
// exist; errors from the runtime (CudaDeviceCount's included) name the
// failing call.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COMPUTE_CUDA_CUDA_BACKEND_H_
