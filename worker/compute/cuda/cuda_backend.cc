// CudaBackend: the Backend interface on one CUDA stream, with cuBLAS for
// the dense algebra and this folder's kernels (cuda_kernels.h) for the rest.
#include "worker/compute/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/compute/cuda/cuda_backend_impl.h"

namespace pipetrain {
namespace cuda_internal {
namespace {

// cuBLAS takes int sizes.
absl::Status CheckGemmInts(std::initializer_list<int64_t> values) {
  for (int64_t v : values) {
    if (v < 0 || v > INT_MAX) {
      return absl::InvalidArgumentError(absl::StrCat("Gemm: size or stride ", v,
                                                     " outside [0, ", INT_MAX,
                                                     "] (cuBLAS takes int)"));
    }
  }
  return absl::OkStatus();
}

cublasOperation_t CublasOp(bool trans) {
  return trans ? CUBLAS_OP_T : CUBLAS_OP_N;
}

// With k == 0 neither A nor B is read, but cuBLAS still wants ld >= 1.
int LeadingDim(int64_t ld, int64_t k) {
  return static_cast<int>(k == 0 && ld < 1 ? 1 : ld);
}

}  // namespace

absl::Status EmptyOrNegative(const char* op, int64_t n) {
  if (n == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": negative size ", n));
}

absl::Status CheckRowShape(const char* op, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0 || rows > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": bad shape [", rows, ", ", cols, "] (rows at most ",
                     INT_MAX, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Backend>> CudaBackend::Create(int device) {
  std::unique_ptr<CudaBackend> backend(new CudaBackend(device));
  RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<Backend>(std::move(backend));
}

absl::Status CudaBackend::Init() {
  RETURN_IF_ERROR(Activate());
  cudaDeviceProp prop;
  RETURN_IF_CUDA_ERR(cudaGetDeviceProperties(&prop, device_));
  const double gib = static_cast<double>(prop.totalGlobalMem) / (1ull << 30);
  description_ = absl::StrCat("cuda:", device_, " (", prop.name, ", ",
                              static_cast<int64_t>(gib + 0.5), " GiB, sm_",
                              prop.major, prop.minor, ")");
  RETURN_IF_CUDA_ERR(
      cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  RETURN_IF_CUBLAS_ERR(cublasCreate(&cublas_));
  RETURN_IF_CUBLAS_ERR(cublasSetStream(cublas_, stream_));
  // Plain FP32 (no TF32 tensor-op math) so results match the CPU closely.
  RETURN_IF_CUBLAS_ERR(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
  ASSIGN_OR_RETURN(scratch_, cache_->Acquire(kScratchBytes));
  reduce_scratch_ = static_cast<double*>(scratch_);
  bad_index_ =
      reinterpret_cast<unsigned long long*>(reduce_scratch_ + kReduceDoubles);
  return absl::OkStatus();
}

CudaBackend::~CudaBackend() {
  // Errors are ignored: nothing can be done about them here, and the
  // process may be exiting with the runtime already torn down.
  (void)cudaSetDevice(device_);
  if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
  if (cublas_ != nullptr) (void)cublasDestroy(cublas_);
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  if (scratch_ != nullptr) cache_->Release(scratch_, kScratchBytes);
  (void)cudaGetLastError();
}

absl::StatusOr<Tensor> CudaBackend::AllocateImpl(const Shape& shape,
                                                 bool zero) {
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Allocate: negative dimension in ", ShapeToString(shape)));
    }
  }
  const size_t bytes = static_cast<size_t>(NumElements(shape)) * sizeof(float);
  if (bytes == 0) {
    return Tensor(std::make_shared<Storage>(nullptr, 0, Device::kCuda, nullptr),
                  shape);
  }
  RETURN_IF_ERROR(Activate());
  ASSIGN_OR_RETURN(void* data, cache_->Acquire(bytes));
  // The deleter owns a reference to the cache: tensors may outlive us.
  auto storage = std::make_shared<Storage>(
      data, bytes, Device::kCuda, [cache = cache_](void* block, size_t size) {
        cache->Release(block, size);
      });
  if (zero) RETURN_IF_CUDA_ERR(cudaMemsetAsync(data, 0, bytes, stream_));
  return Tensor(std::move(storage), shape);
}

absl::StatusOr<ScratchBlock> CudaBackend::Scratch(int64_t floats) {
  if (floats <= 0) return ScratchBlock();
  const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  ASSIGN_OR_RETURN(void* data, cache_->Acquire(bytes));
  return ScratchBlock(cache_, data, bytes);
}

absl::Status CudaBackend::ClearBadIndex() {
  // All-one bytes: the "nothing bad" value the kernels lower with atomicMin.
  RETURN_IF_CUDA_ERR(
      cudaMemsetAsync(bad_index_, 0xff, sizeof(*bad_index_), stream_));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CudaBackend::ReadBadIndex() {
  unsigned long long index = 0;
  RETURN_IF_CUDA_ERR(cudaMemcpyAsync(&index, bad_index_, sizeof(index),
                                     cudaMemcpyDeviceToHost, stream_));
  RETURN_IF_CUDA_ERR(cudaStreamSynchronize(stream_));
  return index == ~0ull ? -1 : static_cast<int64_t>(index);
}

absl::StatusOr<float> CudaBackend::ReadValue(const float* device_value) {
  float value = 0.0f;
  RETURN_IF_CUDA_ERR(cudaMemcpyAsync(&value, device_value, sizeof(value),
                                     cudaMemcpyDeviceToHost, stream_));
  RETURN_IF_CUDA_ERR(cudaStreamSynchronize(stream_));
  return value;
}

absl::Status CudaBackend::CopyFromHost(const float* host, int64_t n,
                                       float* dst) {
  if (n <= 0) return EmptyOrNegative("CopyFromHost", n);
  RETURN_IF_ERROR(Activate());
  // From pageable memory the copy returns once `host` was staged; from
  // pinned memory it would still read `host` later, so wait for it: the
  // caller may reuse its buffer as soon as we return.
  cudaPointerAttributes attrs{};
  bool pinned = false;
  if (cudaPointerGetAttributes(&attrs, host) == cudaSuccess) {
    pinned = attrs.type == cudaMemoryTypeHost;
  } else {
    (void)cudaGetLastError();  // Unknown pointer: treat it as pageable.
  }
  RETURN_IF_CUDA_ERR(cudaMemcpyAsync(dst, host, n * sizeof(float),
                                     cudaMemcpyHostToDevice, stream_));
  if (pinned) RETURN_IF_CUDA_ERR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyToHost(const float* src, int64_t n, float* host) {
  if (n <= 0) return EmptyOrNegative("CopyToHost", n);
  RETURN_IF_ERROR(Activate());
  RETURN_IF_CUDA_ERR(cudaMemcpyAsync(host, src, n * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream_));
  RETURN_IF_CUDA_ERR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::Copy(const float* src, int64_t n, float* dst) {
  if (n <= 0) return EmptyOrNegative("Copy", n);
  RETURN_IF_ERROR(Activate());
  RETURN_IF_CUDA_ERR(cudaMemcpyAsync(dst, src, n * sizeof(float),
                                     cudaMemcpyDeviceToDevice, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::Synchronize() {
  RETURN_IF_ERROR(Activate());
  RETURN_IF_CUDA_ERR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the same
// buffers read column-major are the transposes, so swap A and B (and m, n).
absl::Status CudaBackend::Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n,
                               int64_t k, float alpha, const float* a,
                               int64_t lda, const float* b, int64_t ldb,
                               float beta, float* c, int64_t ldc) {
  RETURN_IF_ERROR(CheckGemmInts({m, n, k, lda, ldb, ldc}));
  if (m == 0 || n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Activate());
  RETURN_IF_CUBLAS_ERR(cublasSgemm(
      cublas_, CublasOp(trans_b), CublasOp(trans_a), static_cast<int>(n),
      static_cast<int>(m), static_cast<int>(k), &alpha, b, LeadingDim(ldb, k),
      a, LeadingDim(lda, k), &beta, c, static_cast<int>(ldc)));
  return absl::OkStatus();
}

absl::Status CudaBackend::GemmStridedBatched(
    bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
    const float* a, int64_t lda, int64_t stride_a, const float* b, int64_t ldb,
    int64_t stride_b, float beta, float* c, int64_t ldc, int64_t stride_c,
    int64_t batch) {
  RETURN_IF_ERROR(CheckGemmInts({m, n, k, lda, ldb, ldc, batch}));
  if (stride_a < 0 || stride_b < 0 || stride_c < 0) {
    return absl::InvalidArgumentError("GemmStridedBatched: negative stride");
  }
  if (m == 0 || n == 0 || batch == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Activate());
  RETURN_IF_CUBLAS_ERR(cublasSgemmStridedBatched(
      cublas_, CublasOp(trans_b), CublasOp(trans_a), static_cast<int>(n),
      static_cast<int>(m), static_cast<int>(k), &alpha, b, LeadingDim(ldb, k),
      stride_b, a, LeadingDim(lda, k), stride_a, &beta, c,
      static_cast<int>(ldc), stride_c, static_cast<int>(batch)));
  return absl::OkStatus();
}

}  // namespace cuda_internal

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaErrorNoDevice) {
    (void)cudaGetLastError();  // Not an error here: the answer is 0.
    return 0;
  }
  if (err != cudaSuccess) {
    return CudaErrorToStatus(err, "cudaGetDeviceCount(&count)", __FILE__,
                             __LINE__);
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device) {
  ASSIGN_OR_RETURN(const int count, CudaDeviceCount());
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", device, " does not exist (", count,
                     " usable CUDA device", count == 1 ? "" : "s", ")"));
  }
  return cuda_internal::CudaBackend::Create(device);
}

}  // namespace pipetrain
