// CudaBackend's kernel-backed operations: argument checks, then one launcher
// from cuda_kernels.h per op, all on the backend's stream.
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/compute/cuda/cuda_backend_impl.h"

namespace pipetrain {
namespace cuda_internal {

namespace kernels = cuda_kernels;

// ---- Element-wise ----

absl::Status CudaBackend::Fill(float* x, int64_t n, float value) {
  if (n <= 0) return EmptyOrNegative("Fill", n);
  RETURN_IF_ERROR(Activate());
  RETURN_IF_CUDA_ERR(kernels::Fill(stream_, n, value, x));
  return absl::OkStatus();
}

absl::Status CudaBackend::Axpby(int64_t n, float alpha, const float* x,
                                float beta, float* y) {
  if (n <= 0) return EmptyOrNegative("Axpby", n);
  RETURN_IF_ERROR(Activate());
  RETURN_IF_CUDA_ERR(kernels::Axpby(stream_, n, alpha, x, beta, y));
  return absl::OkStatus();
}

absl::Status CudaBackend::Add(int64_t n, const float* a, const float* b,
                              float* out) {
  if (n <= 0) return EmptyOrNegative("Add", n);
  RETURN_IF_ERROR(Activate());
  RETURN_IF_CUDA_ERR(kernels::Add(stream_, n, a, b, out));
  return absl::OkStatus();
}

absl::Status CudaBackend::AddRowBroadcast(int64_t rows, int64_t cols,
                                          const float* bias, float* x) {
  RETURN_IF_ERROR(CheckRowShape("AddRowBroadcast", rows, cols));
  if (rows == 0 || cols == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Activate());
  RETURN_IF_CUDA_ERR(kernels::AddRowBroadcast(stream_, rows, cols, bias, x));
  return absl::OkStatus();
}

absl::Status CudaBackend::ReluForward(int64_t n, const float* x, float* y) {
  if (n <= 0) return EmptyOrNegative("ReluForward", n);
  RETURN_IF_ERROR(Activate());
  RETURN_IF_CUDA_ERR(kernels::ReluForward(stream_, n, x, y));
  return absl::OkStatus();
}

absl::Status CudaBackend::ReluBackward(int64_t n, const float* y,
                                       const float* dy, float* dx) {
  if (n <= 0) return EmptyOrNegative("ReluBackward", n);
  RETURN_IF_ERROR(Activate());
  RETURN_IF_CUDA_ERR(kernels::ReluBackward(stream_, n, y, dy, dx));
  return absl::OkStatus();
}

absl::Status CudaBackend::GeluForward(int64_t n, const float* x, float* y) {
  if (n <= 0) return EmptyOrNegative("GeluForward", n);
  RETURN_IF_ERROR(Activate());
  RETURN_IF_CUDA_ERR(kernels::GeluForward(stream_, n, x, y));
  return absl::OkStatus();
}

absl::Status CudaBackend::GeluBackward(int64_t n, const float* x,
                                       const float* dy, float* dx) {
  if (n <= 0) return EmptyOrNegative("GeluBackward", n);
  RETURN_IF_ERROR(Activate());
  RETURN_IF_CUDA_ERR(kernels::GeluBackward(stream_, n, x, dy, dx));
  return absl::OkStatus();
}

absl::Status CudaBackend::Dropout(int64_t n, const float* x, float rate,
                                  uint64_t seed, float* y) {
  if (n <= 0) return EmptyOrNegative("Dropout", n);
  RETURN_IF_ERROR(Activate());
  RETURN_IF_CUDA_ERR(kernels::Dropout(stream_, n, x, rate, seed, y));
  return absl::OkStatus();
}

// ---- Reductions ----

absl::Status CudaBackend::ColumnSum(int64_t rows, int64_t cols, const float* x,
                                    float beta, float* out) {
  RETURN_IF_ERROR(CheckRowShape("ColumnSum", rows, cols));
  if (cols == 0) return absl::OkStatus();  // rows == 0 still scales `out`.
  RETURN_IF_ERROR(Activate());
  ASSIGN_OR_RETURN(ScratchBlock scratch,
                   Scratch(kernels::ColumnSumScratchFloats(rows, cols)));
  RETURN_IF_CUDA_ERR(
      kernels::ColumnSum(stream_, rows, cols, x, beta, out, scratch.f32()));
  return absl::OkStatus();
}

absl::StatusOr<double> CudaBackend::SumSquares(int64_t n, const float* x) {
  if (n <= 0) {
    RETURN_IF_ERROR(EmptyOrNegative("SumSquares", n));
    return 0.0;
  }
  RETURN_IF_ERROR(Activate());
  double* result = reduce_scratch_ + kReduceDoubles - 1;
  RETURN_IF_CUDA_ERR(
      kernels::SumSquares(stream_, n, x, reduce_scratch_, result));
  double host = 0.0;
  RETURN_IF_CUDA_ERR(cudaMemcpyAsync(&host, result, sizeof(double),
                                     cudaMemcpyDeviceToHost, stream_));
  RETURN_IF_CUDA_ERR(cudaStreamSynchronize(stream_));
  return host;
}

// ---- Row-wise ----

absl::Status CudaBackend::SoftmaxForward(int64_t rows, int64_t cols,
                                         int64_t causal_t, const float* x,
                                         float* y) {
  RETURN_IF_ERROR(CheckRowShape("SoftmaxForward", rows, cols));
  if (rows == 0 || cols == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Activate());
  RETURN_IF_CUDA_ERR(
      kernels::SoftmaxForward(stream_, rows, cols, causal_t, x, y));
  return absl::OkStatus();
}

absl::Status CudaBackend::SoftmaxBackward(int64_t rows, int64_t cols,
                                          const float* y, const float* dy,
                                          float* dx) {
  RETURN_IF_ERROR(CheckRowShape("SoftmaxBackward", rows, cols));
  if (rows == 0 || cols == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Activate());
  RETURN_IF_CUDA_ERR(kernels::SoftmaxBackward(stream_, rows, cols, y, dy, dx));
  return absl::OkStatus();
}

absl::Status CudaBackend::LayerNormForward(int64_t rows, int64_t cols,
                                           const float* x, const float* gamma,
                                           const float* beta, float eps,
                                           float* y, float* mean, float* rstd) {
  RETURN_IF_ERROR(CheckRowShape("LayerNormForward", rows, cols));
  if (rows == 0 || cols == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Activate());
  RETURN_IF_CUDA_ERR(kernels::LayerNormForward(stream_, rows, cols, x, gamma,
                                               beta, eps, y, mean, rstd));
  return absl::OkStatus();
}

absl::Status CudaBackend::LayerNormBackward(int64_t rows, int64_t cols,
                                            const float* x, const float* gamma,
                                            const float* mean,
                                            const float* rstd, const float* dy,
                                            float* dx, float* dgamma,
                                            float* dbeta) {
  RETURN_IF_ERROR(CheckRowShape("LayerNormBackward", rows, cols));
  if (rows == 0 || cols == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Activate());
  ASSIGN_OR_RETURN(
      ScratchBlock scratch,
      Scratch(kernels::LayerNormBackwardScratchFloats(rows, cols)));
  RETURN_IF_CUDA_ERR(kernels::LayerNormBackward(stream_, rows, cols, x, gamma,
                                                mean, rstd, dy, dx, dgamma,
                                                dbeta, scratch.f32()));
  return absl::OkStatus();
}

absl::Status CudaBackend::SoftmaxCrossEntropy(int64_t rows, int64_t cols,
                                              const float* logits,
                                              const float* labels, float* probs,
                                              float* loss, float* correct) {
  RETURN_IF_ERROR(CheckRowShape("SoftmaxCrossEntropy", rows, cols));
  if (rows == 0) return absl::OkStatus();
  if (cols == 0) {
    return absl::InvalidArgumentError(
        "SoftmaxCrossEntropy: no classes, so every label is out of range");
  }
  RETURN_IF_ERROR(Activate());
  RETURN_IF_ERROR(ClearBadIndex());
  RETURN_IF_CUDA_ERR(kernels::SoftmaxCrossEntropy(
      stream_, rows, cols, logits, labels, probs, loss, correct, bad_index_));
  ASSIGN_OR_RETURN(const int64_t bad_row, ReadBadIndex());
  if (bad_row < 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(const float label, ReadValue(labels + bad_row));
  return absl::InvalidArgumentError(
      absl::StrCat("label ", label, " of row ", bad_row,
                   " is not an integer in [0, ", cols, ")"));
}

absl::Status CudaBackend::SoftmaxCrossEntropyBackward(
    int64_t rows, int64_t cols, const float* probs, const float* labels,
    float scale, float* dlogits) {
  RETURN_IF_ERROR(CheckRowShape("SoftmaxCrossEntropyBackward", rows, cols));
  if (rows == 0 || cols == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Activate());
  RETURN_IF_CUDA_ERR(kernels::SoftmaxCrossEntropyBackward(
      stream_, rows, cols, probs, labels, scale, dlogits));
  return absl::OkStatus();
}

// ---- Gather / scatter / layout ----

absl::Status CudaBackend::EmbeddingForward(int64_t n, int64_t dim,
                                           int64_t vocab, const float* ids,
                                           const float* table, float* out) {
  if (n < 0 || dim < 0 || vocab < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("EmbeddingForward: negative size (n ", n, ", dim ", dim,
                     ", vocab ", vocab, ")"));
  }
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Activate());
  RETURN_IF_ERROR(ClearBadIndex());
  RETURN_IF_CUDA_ERR(kernels::EmbeddingForward(stream_, n, dim, vocab, ids,
                                               table, out, bad_index_));
  ASSIGN_OR_RETURN(const int64_t bad_position, ReadBadIndex());
  if (bad_position < 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(const float id, ReadValue(ids + bad_position));
  return absl::InvalidArgumentError(
      absl::StrCat("token id ", id, " at position ", bad_position,
                   " is not an integer in [0, ", vocab, ")"));
}

absl::Status CudaBackend::EmbeddingBackward(int64_t n, int64_t dim,
                                            const float* ids, const float* dy,
                                            float* dtable) {
  if (n < 0 || dim < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "EmbeddingBackward: negative size (n ", n, ", dim ", dim, ")"));
  }
  if (n == 0 || dim == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Activate());
  RETURN_IF_CUDA_ERR(
      kernels::EmbeddingBackward(stream_, n, dim, ids, dy, dtable));
  return absl::OkStatus();
}

absl::Status CudaBackend::Permute(const Permute4& p, const float* in,
                                  float* out) {
  bool seen[4] = {false, false, false, false};
  for (int k = 0; k < 4; ++k) {
    if (p.dims[k] < 0 || p.perm[k] < 0 || p.perm[k] > 3 || seen[p.perm[k]]) {
      return absl::InvalidArgumentError(
          absl::StrCat("Permute: bad dims [", p.dims[0], ", ", p.dims[1], ", ",
                       p.dims[2], ", ", p.dims[3], "] or perm (", p.perm[0],
                       ", ", p.perm[1], ", ", p.perm[2], ", ", p.perm[3], ")"));
    }
    seen[p.perm[k]] = true;
  }
  if (p.dims[0] * p.dims[1] * p.dims[2] * p.dims[3] == 0) {
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(Activate());
  RETURN_IF_CUDA_ERR(kernels::Permute(stream_, p.dims, p.perm, in, out));
  return absl::OkStatus();
}

// ---- Optimizer updates ----

absl::Status CudaBackend::SgdUpdate(int64_t n, float* w, const float* g,
                                    float* m, float lr, float momentum,
                                    float weight_decay, float grad_scale) {
  if (n <= 0) return EmptyOrNegative("SgdUpdate", n);
  RETURN_IF_ERROR(Activate());
  RETURN_IF_CUDA_ERR(kernels::SgdUpdate(stream_, n, w, g, m, lr, momentum,
                                        weight_decay, grad_scale));
  return absl::OkStatus();
}

absl::Status CudaBackend::AdamWUpdate(int64_t n, float* w, const float* g,
                                      float* m, float* v, float lr, float beta1,
                                      float beta2, float eps,
                                      float weight_decay, float bias1,
                                      float bias2, float grad_scale) {
  if (n <= 0) return EmptyOrNegative("AdamWUpdate", n);
  RETURN_IF_ERROR(Activate());
  RETURN_IF_CUDA_ERR(kernels::AdamWUpdate(stream_, n, w, g, m, v, lr, beta1,
                                          beta2, eps, weight_decay, bias1,
                                          bias2, grad_scale));
  return absl::OkStatus();
}

}  // namespace cuda_internal
}  // namespace pipetrain
