// Row-wise kernels: one block per row; the block walks the row with a
// stride of blockDim.x and combines per-thread values with warp shuffles
// (BlockReduce). Every pass over the row finishes before the next starts,
// so outputs may alias inputs where backend.h allows it.
//
// The per-element arithmetic follows the CPU backend's order of operations
// (cpu_backend.cc) so that the two agree to rounding of the sums.
#include <cmath>

#include "worker/compute/cuda/column_reduce.cuh"
#include "worker/compute/cuda/cuda_kernels.h"
#include "worker/compute/cuda/kernel_common.cuh"

namespace pipetrain {
namespace cuda_kernels {
namespace {

__device__ float RowMax(const float* x, int64_t count) {
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < count; c += blockDim.x) m = fmaxf(m, x[c]);
  return BlockReduce(m, MaxOp(), -INFINITY);
}

__device__ float RowSumExp(const float* x, int64_t count, float max) {
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < count; c += blockDim.x) {
    s += expf(x[c] - max);
  }
  return BlockReduce(s, SumOp(), 0.0f);
}

__global__ void __launch_bounds__(kMaxRowThreads)
    SoftmaxForwardKernel(int64_t cols, int64_t causal_t, const float* x,
                         float* y) {
  const int64_t row = blockIdx.x;
  const float* xr = x + row * cols;
  float* yr = y + row * cols;
  int64_t valid = cols;
  if (causal_t > 0 && row % causal_t + 1 < cols) valid = row % causal_t + 1;
  const float max = RowMax(xr, valid);
  const float inv = 1.0f / RowSumExp(xr, valid, max);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    yr[c] = c < valid ? expf(xr[c] - max) * inv : 0.0f;
  }
}

__global__ void __launch_bounds__(kMaxRowThreads)
    SoftmaxBackwardKernel(int64_t cols, const float* y, const float* dy,
                          float* dx) {
  const int64_t offset = static_cast<int64_t>(blockIdx.x) * cols;
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    dot += dy[offset + c] * y[offset + c];
  }
  dot = BlockReduce(dot, SumOp(), 0.0f);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    dx[offset + c] = y[offset + c] * (dy[offset + c] - dot);
  }
}

__global__ void __launch_bounds__(kMaxRowThreads)
    LayerNormForwardKernel(int64_t cols, const float* x, const float* gamma,
                           const float* beta, float eps, float* y, float* mean,
                           float* rstd) {
  const int64_t row = blockIdx.x;
  const float* xr = x + row * cols;
  float* yr = y + row * cols;
  // Moments in double, as on the CPU.
  double sum = 0.0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += xr[c];
  const float mu = static_cast<float>(BlockReduce(sum, SumOp(), 0.0) / cols);
  double sq = 0.0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const double d = xr[c] - mu;
    sq += d * d;
  }
  const double var = BlockReduce(sq, SumOp(), 0.0) / cols;
  const float rs = 1.0f / sqrtf(static_cast<float>(var) + eps);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    yr[c] = (xr[c] - mu) * rs * gamma[c] + beta[c];
  }
  if (threadIdx.x == 0) {
    if (mean != nullptr) mean[row] = mu;
    if (rstd != nullptr) rstd[row] = rs;
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma.
__global__ void __launch_bounds__(kMaxRowThreads)
    LayerNormBackwardKernel(int64_t cols, const float* x, const float* gamma,
                            const float* mean, const float* rstd,
                            const float* dy, float* dx) {
  const int64_t row = blockIdx.x;
  const int64_t offset = row * cols;
  const float mu = mean[row];
  const float rs = rstd[row];
  float sum_g = 0.0f;
  float sum_gx = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float g = dy[offset + c] * gamma[c];
    const float xhat = (x[offset + c] - mu) * rs;
    sum_g += g;
    sum_gx += g * xhat;
  }
  sum_g = BlockReduce(sum_g, SumOp(), 0.0f);
  sum_gx = BlockReduce(sum_gx, SumOp(), 0.0f);
  const float inv_n = 1.0f / cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float g = dy[offset + c] * gamma[c];
    const float xhat = (x[offset + c] - mu) * rs;
    dx[offset + c] = rs * (g - inv_n * sum_g - xhat * inv_n * sum_gx);
  }
}

// dgamma's column terms: dy * xhat.
struct LoadDyXhat {
  const float* x;
  const float* dy;
  const float* mean;
  const float* rstd;
  int64_t cols;
  __device__ float operator()(int64_t r, int64_t c) const {
    const int64_t i = r * cols + c;
    return dy[i] * (x[i] - mean[r]) * rstd[r];
  }
};

__global__ void __launch_bounds__(kMaxRowThreads)
    SoftmaxCrossEntropyKernel(int64_t cols, const float* logits,
                              const float* labels, float* probs, float* loss,
                              float* correct, unsigned long long* first_bad) {
  const int64_t row = blockIdx.x;
  const float* xr = logits + row * cols;
  float* pr = probs + row * cols;
  // Thread 0 reads its row's label logit before the first barrier, hence
  // before any thread writes probs (which may then even alias logits).
  const float label_value = labels[row];
  const bool valid = ValidIndex(label_value, cols);
  const int64_t label = valid ? static_cast<int64_t>(label_value) : 0;
  const float label_logit = threadIdx.x == 0 && valid ? xr[label] : 0.0f;
  const float max = RowMax(xr, cols);
  const float inv = 1.0f / RowSumExp(xr, cols, max);
  int64_t argmax = cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = xr[c];
    pr[c] = expf(v - max) * inv;
    if (v == max && c < argmax) argmax = c;
  }
  argmax = BlockReduce(argmax, MinOp(), cols);  // The first maximum.
  if (threadIdx.x != 0) return;
  if (!valid) {
    RecordBadIndex(first_bad, row);
    loss[row] = NAN;
    correct[row] = 0.0f;
    return;
  }
  // -log(p[label]) with p as written above, clamped as on the CPU.
  const float p = expf(label_logit - max) * inv;
  loss[row] = -logf(fmaxf(p, 1e-30f));
  correct[row] = argmax == label ? 1.0f : 0.0f;
}

__global__ void SoftmaxCrossEntropyBackwardKernel(int64_t n, int64_t cols,
                                                  const float* probs,
                                                  const float* labels,
                                                  float scale, float* dlogits) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    const int64_t row = i / cols;
    const float label_value = labels[row];
    const bool hot = ValidIndex(label_value, cols) &&
                     static_cast<int64_t>(label_value) == i - row * cols;
    dlogits[i] = scale * (probs[i] - (hot ? 1.0f : 0.0f));
  }
}

}  // namespace

cudaError_t SoftmaxForward(cudaStream_t stream, int64_t rows, int64_t cols,
                           int64_t causal_t, const float* x, float* y) {
  SoftmaxForwardKernel<<<static_cast<unsigned>(rows), RowThreads(cols), 0,
                         stream>>>(cols, causal_t, x, y);
  return cudaGetLastError();
}

cudaError_t SoftmaxBackward(cudaStream_t stream, int64_t rows, int64_t cols,
                            const float* y, const float* dy, float* dx) {
  SoftmaxBackwardKernel<<<static_cast<unsigned>(rows), RowThreads(cols), 0,
                          stream>>>(cols, y, dy, dx);
  return cudaGetLastError();
}

cudaError_t LayerNormForward(cudaStream_t stream, int64_t rows, int64_t cols,
                             const float* x, const float* gamma,
                             const float* beta, float eps, float* y,
                             float* mean, float* rstd) {
  LayerNormForwardKernel<<<static_cast<unsigned>(rows), RowThreads(cols), 0,
                           stream>>>(cols, x, gamma, beta, eps, y, mean, rstd);
  return cudaGetLastError();
}

int64_t LayerNormBackwardScratchFloats(int64_t rows, int64_t cols) {
  // dgamma and dbeta reuse one scratch area one after the other (stream order).
  return ColumnSumScratchFloats(rows, cols);
}

cudaError_t LayerNormBackward(cudaStream_t stream, int64_t rows, int64_t cols,
                              const float* x, const float* gamma,
                              const float* mean, const float* rstd,
                              const float* dy, float* dx, float* dgamma,
                              float* dbeta, float* scratch) {
  LayerNormBackwardKernel<<<static_cast<unsigned>(rows), RowThreads(cols), 0,
                            stream>>>(cols, x, gamma, mean, rstd, dy, dx);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  err = ColumnReduce(stream, rows, cols, LoadDyXhat{x, dy, mean, rstd, cols},
                     1.0f, dgamma, scratch);
  if (err != cudaSuccess) return err;
  return ColumnReduce(stream, rows, cols, LoadMatrix{dy, cols}, 1.0f, dbeta,
                      scratch);
}

cudaError_t SoftmaxCrossEntropy(cudaStream_t stream, int64_t rows, int64_t cols,
                                const float* logits, const float* labels,
                                float* probs, float* loss, float* correct,
                                unsigned long long* first_bad) {
  SoftmaxCrossEntropyKernel<<<static_cast<unsigned>(rows), RowThreads(cols), 0,
                              stream>>>(cols, logits, labels, probs, loss,
                                        correct, first_bad);
  return cudaGetLastError();
}

cudaError_t SoftmaxCrossEntropyBackward(cudaStream_t stream, int64_t rows,
                                        int64_t cols, const float* probs,
                                        const float* labels, float scale,
                                        float* dlogits) {
  const int64_t n = rows * cols;
  SoftmaxCrossEntropyBackwardKernel<<<GridFor(n), kThreads, 0, stream>>>(
      n, cols, probs, labels, scale, dlogits);
  return cudaGetLastError();
}

}  // namespace cuda_kernels
}  // namespace pipetrain
