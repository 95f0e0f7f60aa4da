#include "worker/compute/backend.h"

#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain {

int64_t Backend::MemoryBytes() const {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  long total_pages = 0;
  long resident_pages = 0;
  const int fields = std::fscanf(f, "%ld %ld", &total_pages, &resident_pages);
  std::fclose(f);
  if (fields != 2) return -1;
  return static_cast<int64_t>(resident_pages) * sysconf(_SC_PAGESIZE);
}

absl::StatusOr<bool> Backend::PackOperand(bool, int64_t, int64_t, const float*,
                                          int64_t, PackedOperand*) {
  return false;
}

absl::Status Backend::GemmPacked(int64_t, const float*, int64_t,
                                 const PackedOperand&, float*, int64_t) {
  return absl::UnimplementedError(
      absl::StrCat(Describe(), " has no packed GEMM (PackOperand said so)"));
}

bool Backend::ResumesSums(bool, bool, int64_t, int64_t, int64_t) const {
  return false;
}

absl::Status Backend::GemmResume(bool, bool, int64_t, int64_t, int64_t,
                                 const float*, int64_t, const float*, int64_t,
                                 float*, int64_t) {
  return absl::FailedPreconditionError(
      absl::StrCat(Describe(), " cannot resume a sum (ResumesSums said so)"));
}

absl::StatusOr<BackendKind> ParseBackendKind(const std::string& name) {
  if (name == "auto") return BackendKind::kAuto;
  if (name == "cpu") return BackendKind::kCpu;
  if (name == "cuda" || name == "gpu") return BackendKind::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device '", name, "' (want auto, cpu or cuda)"));
}

absl::StatusOr<Tensor> ToDevice(Backend* backend, const Tensor& host) {
  if (host.device() != Device::kCpu || host.dtype() != DType::kF32) {
    return absl::InvalidArgumentError("ToDevice needs a float32 host tensor");
  }
  ASSIGN_OR_RETURN(Tensor out, backend->AllocateUninitialized(host.shape()));
  RETURN_IF_ERROR(backend->CopyFromHost(host.f32(), host.numel(), out.f32()));
  return out;
}

absl::StatusOr<Tensor> ToHost(Backend* backend, const Tensor& device_tensor) {
  if (device_tensor.dtype() != DType::kF32) {
    return absl::InvalidArgumentError("ToHost needs a float32 tensor");
  }
  ASSIGN_OR_RETURN(Tensor out, Tensor::TryHost(device_tensor.shape()));
  RETURN_IF_ERROR(backend->CopyToHost(device_tensor.f32(),
                                      device_tensor.numel(), out.f32()));
  return out;
}

}  // namespace pipetrain
