// Element-wise math shared by the CPU and CUDA backends. Each function is
// the single definition of its formula; the CPU backend loops over it and
// the CUDA kernels call it per element.
#ifndef PIPETRAIN_WORKER_COMPUTE_ELEMENTWISE_MATH_H_
#define PIPETRAIN_WORKER_COMPUTE_ELEMENTWISE_MATH_H_

#include <cmath>
#include <cstdint>

#include "worker/compute/host_device.h"

namespace pipetrain {
namespace math {

PT_HOST_DEVICE inline float Relu(float x) { return x > 0.0f ? x : 0.0f; }

// Gradient of ReLU expressed through its output y (saves keeping x).
PT_HOST_DEVICE inline float ReluGrad(float y, float dy) {
  return y > 0.0f ? dy : 0.0f;
}

// GELU, tanh approximation.
PT_HOST_DEVICE inline float Gelu(float x) {
  const float kAlpha = 0.7978845608028654f;  // sqrt(2 / pi)
  const float inner = kAlpha * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(inner));
}

PT_HOST_DEVICE inline float GeluGrad(float x, float dy) {
  const float kAlpha = 0.7978845608028654f;
  const float x2 = x * x;
  const float inner = kAlpha * (x + 0.044715f * x2 * x);
  const float t = tanhf(inner);
  const float dinner = kAlpha * (1.0f + 3.0f * 0.044715f * x2);
  return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dinner);
}

// SplitMix64: a counter-based generator, so element i of a random stream is
// a pure function of (seed, i) on every device.
PT_HOST_DEVICE inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) from (seed, index), 24 bits of resolution.
PT_HOST_DEVICE inline float UniformAt(uint64_t seed, uint64_t index) {
  const uint64_t bits = SplitMix64(seed ^ SplitMix64(index));
  return static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
}

// Inverted-dropout multiplier for element `index`: 0 or 1 / (1 - rate).
PT_HOST_DEVICE inline float DropoutScale(uint64_t seed, uint64_t index,
                                         float rate) {
  return UniformAt(seed, index) < rate ? 0.0f : 1.0f / (1.0f - rate);
}

// SGD with momentum and decoupled-from-nothing (L2) weight decay:
//   g' = g * grad_scale + wd * w;  m = momentum * m + g';  w -= lr * m.
// With momentum == 0, m is unused.
PT_HOST_DEVICE inline void SgdStep(float* w, float g, float* m, float lr,
                                   float momentum, float weight_decay,
                                   float grad_scale) {
  float grad = g * grad_scale + weight_decay * *w;
  if (momentum != 0.0f) {
    *m = momentum * *m + grad;
    grad = *m;
  }
  *w -= lr * grad;
}

// AdamW (decoupled weight decay). bias1 = 1 - beta1^t, bias2 = 1 - beta2^t.
PT_HOST_DEVICE inline void AdamWStep(float* w, float g, float* m, float* v,
                                     float lr, float beta1, float beta2,
                                     float eps, float weight_decay, float bias1,
                                     float bias2, float grad_scale) {
  const float grad = g * grad_scale;
  *m = beta1 * *m + (1.0f - beta1) * grad;
  *v = beta2 * *v + (1.0f - beta2) * grad * grad;
  const float m_hat = *m / bias1;
  const float v_hat = *v / bias2;
  *w -= lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * *w);
}

}  // namespace math
}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COMPUTE_ELEMENTWISE_MATH_H_
