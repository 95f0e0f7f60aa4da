// Turning CUDA runtime and cuBLAS errors into absl::Status.
//
// Every CUDA or cuBLAS call in this folder goes through RETURN_IF_CUDA_ERR or
// RETURN_IF_CUBLAS_ERR, so a device error reaches the caller as a Status that
// names the failing expression, file and line; nothing aborts or throws.
//
// Status codes follow what the caller should do:
//   kResourceExhausted   out of device memory (free something, shrink work);
//   kFailedPrecondition  no device, no or too old a driver, a kernel image
//                        missing for this GPU (fix the machine or the build);
//   kInvalidArgument     cuBLAS rejected the arguments
//   (CUBLAS_STATUS_INVALID_VALUE); kInternal            everything else (a
//   kernel fault, a bug).
#ifndef PIPETRAIN_WORKER_COMPUTE_CUDA_CUDA_STATUS_H_
#define PIPETRAIN_WORKER_COMPUTE_CUDA_CUDA_STATUS_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace pipetrain {

// The Status for a failed CUDA runtime call `expr` at `file`:`line`. Also
// clears the thread's last-error slot, so that a later cudaGetLastError()
// after a kernel launch does not report this error a second time.
absl::Status CudaErrorToStatus(cudaError_t err, const char* expr,
                               const char* file, int line);

// The Status for a failed cuBLAS call `expr` at `file`:`line`.
absl::Status CublasErrorToStatus(cublasStatus_t status, const char* expr,
                                 const char* file, int line);

}  // namespace pipetrain

// Evaluates `expr` (a cudaError_t) and returns a Status from the enclosing
// function when it is not cudaSuccess. Check kernel launches by passing
// cudaGetLastError() (the launchers in cuda_kernels.h return it).
#define RETURN_IF_CUDA_ERR(expr)                                           \
  do {                                                                     \
    const cudaError_t pt_cuda_err_ = (expr);                               \
    if (pt_cuda_err_ != cudaSuccess) {                                     \
      return ::pipetrain::CudaErrorToStatus(pt_cuda_err_, #expr, __FILE__, \
                                            __LINE__);                     \
    }                                                                      \
  } while (0)

// Evaluates `expr` (a cublasStatus_t) and returns a Status from the enclosing
// function when it is not CUBLAS_STATUS_SUCCESS.
#define RETURN_IF_CUBLAS_ERR(expr)                                      \
  do {                                                                  \
    const cublasStatus_t pt_cublas_status_ = (expr);                    \
    if (pt_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                   \
      return ::pipetrain::CublasErrorToStatus(pt_cublas_status_, #expr, \
                                              __FILE__, __LINE__);      \
    }                                                                   \
  } while (0)

#endif  // PIPETRAIN_WORKER_COMPUTE_CUDA_CUDA_STATUS_H_
