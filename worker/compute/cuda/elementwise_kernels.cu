// Element-wise kernels: grid-stride loops over the shared per-element math
// in elementwise_math.h, so the GPU computes exactly the CPU's formulas.
#include "worker/compute/cuda/cuda_kernels.h"
#include "worker/compute/cuda/kernel_common.cuh"
#include "worker/compute/elementwise_math.h"

namespace pipetrain {
namespace cuda_kernels {
namespace {

// Applies `f(i)` for every i in [0, n).
template <typename F>
__global__ void ForEachKernel(int64_t n, F f) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) f(i);
}

template <typename F>
cudaError_t ForEach(cudaStream_t stream, int64_t n, F f) {
  ForEachKernel<<<GridFor(n), kThreads, 0, stream>>>(n, f);
  return cudaGetLastError();
}

}  // namespace

cudaError_t Fill(cudaStream_t stream, int64_t n, float value, float* x) {
  return ForEach(stream, n, [=] __device__(int64_t i) { x[i] = value; });
}

cudaError_t Axpby(cudaStream_t stream, int64_t n, float alpha, const float* x,
                  float beta, float* y) {
  return ForEach(stream, n, [=] __device__(int64_t i) {
    y[i] = alpha * x[i] + beta * y[i];
  });
}

cudaError_t Add(cudaStream_t stream, int64_t n, const float* a, const float* b,
                float* out) {
  return ForEach(stream, n,
                 [=] __device__(int64_t i) { out[i] = a[i] + b[i]; });
}

cudaError_t AddRowBroadcast(cudaStream_t stream, int64_t rows, int64_t cols,
                            const float* bias, float* x) {
  return ForEach(stream, rows * cols,
                 [=] __device__(int64_t i) { x[i] += bias[i % cols]; });
}

cudaError_t ReluForward(cudaStream_t stream, int64_t n, const float* x,
                        float* y) {
  return ForEach(stream, n,
                 [=] __device__(int64_t i) { y[i] = math::Relu(x[i]); });
}

cudaError_t ReluBackward(cudaStream_t stream, int64_t n, const float* y,
                         const float* dy, float* dx) {
  return ForEach(stream, n, [=] __device__(int64_t i) {
    dx[i] = math::ReluGrad(y[i], dy[i]);
  });
}

cudaError_t GeluForward(cudaStream_t stream, int64_t n, const float* x,
                        float* y) {
  return ForEach(stream, n,
                 [=] __device__(int64_t i) { y[i] = math::Gelu(x[i]); });
}

cudaError_t GeluBackward(cudaStream_t stream, int64_t n, const float* x,
                         const float* dy, float* dx) {
  return ForEach(stream, n, [=] __device__(int64_t i) {
    dx[i] = math::GeluGrad(x[i], dy[i]);
  });
}

cudaError_t Dropout(cudaStream_t stream, int64_t n, const float* x, float rate,
                    uint64_t seed, float* y) {
  return ForEach(stream, n, [=] __device__(int64_t i) {
    y[i] = x[i] * math::DropoutScale(seed, static_cast<uint64_t>(i), rate);
  });
}

cudaError_t SgdUpdate(cudaStream_t stream, int64_t n, float* w, const float* g,
                      float* m, float lr, float momentum, float weight_decay,
                      float grad_scale) {
  const bool use_m = momentum != 0.0f;
  return ForEach(stream, n, [=] __device__(int64_t i) {
    float wi = w[i];
    float mi = use_m ? m[i] : 0.0f;
    math::SgdStep(&wi, g[i], &mi, lr, momentum, weight_decay, grad_scale);
    w[i] = wi;
    if (use_m) m[i] = mi;
  });
}

cudaError_t AdamWUpdate(cudaStream_t stream, int64_t n, float* w,
                        const float* g, float* m, float* v, float lr,
                        float beta1, float beta2, float eps, float weight_decay,
                        float bias1, float bias2, float grad_scale) {
  return ForEach(stream, n, [=] __device__(int64_t i) {
    float wi = w[i];
    float mi = m[i];
    float vi = v[i];
    math::AdamWStep(&wi, g[i], &mi, &vi, lr, beta1, beta2, eps, weight_decay,
                    bias1, bias2, grad_scale);
    w[i] = wi;
    m[i] = mi;
    v[i] = vi;
  });
}

}  // namespace cuda_kernels
}  // namespace pipetrain
