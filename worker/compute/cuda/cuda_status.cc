#include "worker/compute/cuda/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace pipetrain {
namespace {

absl::StatusCode CudaErrorCode(cudaError_t err) {
  switch (err) {
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorStubLibrary:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorInitializationError:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::StatusCode CublasErrorCode(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::StatusCode::kResourceExhausted;
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return absl::StatusCode::kFailedPrecondition;
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::StatusCode::kInvalidArgument;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

absl::Status CudaErrorToStatus(cudaError_t err, const char* expr,
                               const char* file, int line) {
  (void)cudaGetLastError();  // Reported here; do not report it again.
  return absl::Status(
      CudaErrorCode(err),
      absl::StrCat(expr, " failed at ", file, ":", line, ": ",
                   cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

absl::Status CublasErrorToStatus(cublasStatus_t status, const char* expr,
                                 const char* file, int line) {
  return absl::Status(CublasErrorCode(status),
                      absl::StrCat(expr, " failed at ", file, ":", line, ": ",
                                   cublasGetStatusName(status), " (",
                                   cublasGetStatusString(status), ")"));
}

}  // namespace pipetrain
