// The one place that knows which backends were built.
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "worker/compute/backend.h"
#include "worker/compute/cpu/cpu_backend.h"
#if defined(PIPETRAIN_HAVE_CUDA)
#include "worker/compute/cuda/cuda_backend.h"
#endif

namespace pipetrain {

bool CudaAvailable() {
#if defined(PIPETRAIN_HAVE_CUDA)
  return CudaDeviceCount() > 0;
#else
  return false;
#endif
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(
    const BackendOptions& options) {
  switch (options.kind) {
    case BackendKind::kCpu:
      return CreateCpuBackend(options.threads);
    case BackendKind::kCuda:
#if defined(PIPETRAIN_HAVE_CUDA)
      return CreateCudaBackend(options.cuda_device);
#else
      return absl::FailedPreconditionError(
          "this build has no CUDA backend (configure with PIPETRAIN_CUDA=ON "
          "on a machine with nvcc)");
#endif
    case BackendKind::kAuto:
      if (CudaAvailable()) {
#if defined(PIPETRAIN_HAVE_CUDA)
        return CreateCudaBackend(options.cuda_device);
#endif
      }
      return CreateCpuBackend(options.threads);
  }
  return absl::InvalidArgumentError("unknown backend kind");
}

}  // namespace pipetrain
