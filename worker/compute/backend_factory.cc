// The one place that knows which backends were built.
#include "common/logging.h"
#include "worker/compute/backend.h"
#include "worker/compute/cpu/cpu_backend.h"
#if defined(PIPETRAIN_HAVE_CUDA)
#include "worker/compute/cuda/cuda_backend.h"
#endif

namespace pipetrain {

absl::StatusOr<int> UsableCudaDevices() {
#if defined(PIPETRAIN_HAVE_CUDA)
  return CudaDeviceCount();
#else
  return absl::FailedPreconditionError(
      "this build has no CUDA backend (configure with PIPETRAIN_CUDA=ON on a "
      "machine with nvcc)");
#endif
}

bool CudaAvailable() {
  const absl::StatusOr<int> count = UsableCudaDevices();
  return count.ok() && *count > 0;
}

namespace {

// kAuto: CUDA when it works. A CUDA build whose runtime fails says why, so
// that a broken GPU is not silently replaced by the CPU.
absl::StatusOr<std::unique_ptr<Backend>> CreateAutoBackend(
    const BackendOptions& options) {
#if defined(PIPETRAIN_HAVE_CUDA)
  const absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) {
    PT_LOG(WARNING) << "CUDA is unusable, using the CPU backend: "
                    << count.status();
  } else if (*count > 0) {
    absl::StatusOr<std::unique_ptr<Backend>> cuda =
        CreateCudaBackend(options.cuda_device);
    if (cuda.ok()) return cuda;
    PT_LOG(WARNING) << "CUDA device " << options.cuda_device
                    << " does not start, using the CPU backend: "
                    << cuda.status();
  }
#endif
  return CreateCpuBackend(options.threads);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(
    const BackendOptions& options) {
  switch (options.kind) {
    case BackendKind::kCpu:
      return CreateCpuBackend(options.threads);
    case BackendKind::kCuda:
#if defined(PIPETRAIN_HAVE_CUDA)
      return CreateCudaBackend(options.cuda_device);
#else
      return UsableCudaDevices().status();
#endif
    case BackendKind::kAuto:
      return CreateAutoBackend(options);
  }
  return absl::InvalidArgumentError("unknown backend kind");
}

}  // namespace pipetrain
