// CudaBackend's class, shared by cuda_backend.cc (lifetime, memory, GEMM)
// and cuda_backend_ops.cc (the kernel-backed operations). Internal to this
// folder: users go through cuda_backend.h.
#ifndef PIPETRAIN_WORKER_COMPUTE_CUDA_CUDA_BACKEND_IMPL_H_
#define PIPETRAIN_WORKER_COMPUTE_CUDA_CUDA_BACKEND_IMPL_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/compute/backend.h"
#include "worker/compute/cuda/cuda_block_cache.h"
#include "worker/compute/cuda/cuda_kernels.h"
#include "worker/compute/cuda/cuda_status.h"

namespace pipetrain {
namespace cuda_internal {

// OK for n == 0 (nothing to do), InvalidArgument for n < 0. Callers return
// its result when n <= 0.
absl::Status EmptyOrNegative(const char* op, int64_t n);

// Row-wise kernels run one block per row, so rows must fit a grid.
absl::Status CheckRowShape(const char* op, int64_t rows, int64_t cols);

// Persistent device scratch: SumSquares partials and result, then the
// first-bad-index word of SoftmaxCrossEntropy / EmbeddingForward.
constexpr int64_t kReduceDoubles = cuda_kernels::kSumSquaresScratchDoubles;
constexpr size_t kScratchBytes = kReduceDoubles * sizeof(double) + 8;

// Not thread-safe: used by one thread at a time (Backend's contract); its
// tensors may be dropped on any thread (CudaBlockCache is thread-safe).
class CudaBackend : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<Backend>> Create(int device);
  ~CudaBackend() override;

  Device device() const override { return Device::kCuda; }
  std::string Describe() const override { return description_; }
  int64_t MemoryBytes() const override {
    return static_cast<int64_t>(cache_->reserved_bytes());
  }

  absl::StatusOr<Tensor> Allocate(const Shape& shape) override {
    return AllocateImpl(shape, /*zero=*/true);
  }
  absl::StatusOr<Tensor> AllocateUninitialized(const Shape& shape) override {
    return AllocateImpl(shape, /*zero=*/false);
  }
  absl::Status CopyFromHost(const float* host, int64_t n, float* dst) override;
  absl::Status CopyToHost(const float* src, int64_t n, float* host) override;
  absl::Status Copy(const float* src, int64_t n, float* dst) override;
  absl::Status Synchronize() override;

  absl::Status Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                    float alpha, const float* a, int64_t lda, const float* b,
                    int64_t ldb, float beta, float* c, int64_t ldc) override;
  absl::Status GemmStridedBatched(bool trans_a, bool trans_b, int64_t m,
                                  int64_t n, int64_t k, float alpha,
                                  const float* a, int64_t lda, int64_t stride_a,
                                  const float* b, int64_t ldb, int64_t stride_b,
                                  float beta, float* c, int64_t ldc,
                                  int64_t stride_c, int64_t batch) override;

  absl::Status Fill(float* x, int64_t n, float value) override;
  absl::Status Axpby(int64_t n, float alpha, const float* x, float beta,
                     float* y) override;
  absl::Status Add(int64_t n, const float* a, const float* b,
                   float* out) override;
  absl::Status AddRowBroadcast(int64_t rows, int64_t cols, const float* bias,
                               float* x) override;
  absl::Status ReluForward(int64_t n, const float* x, float* y) override;
  absl::Status ReluBackward(int64_t n, const float* y, const float* dy,
                            float* dx) override;
  absl::Status GeluForward(int64_t n, const float* x, float* y) override;
  absl::Status GeluBackward(int64_t n, const float* x, const float* dy,
                            float* dx) override;
  absl::Status Dropout(int64_t n, const float* x, float rate, uint64_t seed,
                       float* y) override;

  absl::Status ColumnSum(int64_t rows, int64_t cols, const float* x, float beta,
                         float* out) override;
  absl::StatusOr<double> SumSquares(int64_t n, const float* x) override;

  absl::Status SoftmaxForward(int64_t rows, int64_t cols, int64_t causal_t,
                              const float* x, float* y) override;
  absl::Status SoftmaxBackward(int64_t rows, int64_t cols, const float* y,
                               const float* dy, float* dx) override;
  absl::Status LayerNormForward(int64_t rows, int64_t cols, const float* x,
                                const float* gamma, const float* beta,
                                float eps, float* y, float* mean,
                                float* rstd) override;
  absl::Status LayerNormBackward(int64_t rows, int64_t cols, const float* x,
                                 const float* gamma, const float* mean,
                                 const float* rstd, const float* dy, float* dx,
                                 float* dgamma, float* dbeta) override;
  absl::Status SoftmaxCrossEntropy(int64_t rows, int64_t cols,
                                   const float* logits, const float* labels,
                                   float* probs, float* loss,
                                   float* correct) override;
  absl::Status SoftmaxCrossEntropyBackward(int64_t rows, int64_t cols,
                                           const float* probs,
                                           const float* labels, float scale,
                                           float* dlogits) override;

  absl::Status EmbeddingForward(int64_t n, int64_t dim, int64_t vocab,
                                const float* ids, const float* table,
                                float* out) override;
  absl::Status EmbeddingBackward(int64_t n, int64_t dim, const float* ids,
                                 const float* dy, float* dtable) override;
  absl::Status Permute(const Permute4& p, const float* in, float* out) override;

  absl::Status SgdUpdate(int64_t n, float* w, const float* g, float* m,
                         float lr, float momentum, float weight_decay,
                         float grad_scale) override;
  absl::Status AdamWUpdate(int64_t n, float* w, const float* g, float* m,
                           float* v, float lr, float beta1, float beta2,
                           float eps, float weight_decay, float bias1,
                           float bias2, float grad_scale) override;

 private:
  explicit CudaBackend(int device)
      : device_(device), cache_(std::make_shared<CudaBlockCache>(device)) {}

  absl::Status Init();
  // Makes this backend's device current on the calling thread (the thread
  // that uses a backend may not be the one that created it).
  absl::Status Activate() {
    RETURN_IF_CUDA_ERR(cudaSetDevice(device_));
    return absl::OkStatus();
  }
  absl::StatusOr<Tensor> AllocateImpl(const Shape& shape, bool zero);
  // A scratch block of `floats` floats (none when 0), back to the cache when
  // it leaves scope.
  absl::StatusOr<ScratchBlock> Scratch(int64_t floats);
  // Resets the device word in which kernels record their first bad input.
  absl::Status ClearBadIndex();
  // Waits for the stream and returns the first bad row / position, or -1.
  absl::StatusOr<int64_t> ReadBadIndex();
  // Copies one float from the device (waits for the stream).
  absl::StatusOr<float> ReadValue(const float* device_value);

  // Constant after construction (the rest are set once, in Init).
  const int device_;
  const std::shared_ptr<CudaBlockCache> cache_;
  std::string description_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* scratch_ = nullptr;                  // kScratchBytes from cache_
  double* reduce_scratch_ = nullptr;         // in scratch_
  unsigned long long* bad_index_ = nullptr;  // after reduce_scratch_
};

}  // namespace cuda_internal
}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COMPUTE_CUDA_CUDA_BACKEND_IMPL_H_
