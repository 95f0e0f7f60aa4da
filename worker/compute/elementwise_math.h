// Element-wise math shared by the CPU and CUDA backends. Each function is
// the single definition of its formula; the CPU backend loops over it and
// the CUDA kernels call it per element.
#ifndef PIPETRAIN_WORKER_COMPUTE_ELEMENTWISE_MATH_H_
#define PIPETRAIN_WORKER_COMPUTE_ELEMENTWISE_MATH_H_

#include <cmath>
#include <cstdint>

#include "worker/compute/half.h"
#include "worker/compute/host_device.h"

namespace pipetrain {
namespace math {

PT_HOST_DEVICE inline float Relu(float x) { return x > 0.0f ? x : 0.0f; }

// Gradient of ReLU expressed through its output y (saves keeping x).
PT_HOST_DEVICE inline float ReluGrad(float y, float dy) {
  return y > 0.0f ? dy : 0.0f;
}

// e^x with x clamped to [-87, 88] (results from 1.6e-38, still a normal
// float, to 1.65e38), within about 2 ulp of the exact value. Branch-free
// arithmetic only, so that a loop over it vectorizes (libm's expf and
// tanhf do not): x = k ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, so
// k ln2 is exact), e^r by its Taylor series to r^7 (truncation below
// 1e-8 relative), 2^k written into the exponent bits (FloatBits and
// BitsToFloat of half.h).
PT_HOST_DEVICE inline float ExpClamped(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  // Adding 1.5 * 2^23 rounds x log2(e) to an integer k held in the low
  // mantissa bits; subtracting it again gives k as a float.
  const float kShift = 12582912.0f;
  const float shifted = x * 1.44269504088896341f + kShift;
  const float k = shifted - kShift;
  const float r = (x - k * 0.693145751953125f) - k * 1.42860682030941723e-6f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // k in [-126, 127]: 2^k is the float with biased exponent k + 127.
  const uint32_t k_bits = FloatBits(shifted) - FloatBits(kShift);
  return p * BitsToFloat((k_bits + 127u) << 23);
}

// GELU, tanh approximation: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x +
// 0.044715 x^3), computed as x * sigmoid(2u) (the same function, since
// (1 + tanh(u)) / 2 = 1 / (1 + e^-2u)) so that it needs one exponential
// and no cancellation where tanh(u) is near -1.
PT_HOST_DEVICE inline float Gelu(float x) {
  const float kAlpha = 0.7978845608028654f;  // sqrt(2 / pi)
  const float inner = kAlpha * (x + 0.044715f * x * x * x);
  return x / (1.0f + ExpClamped(-2.0f * inner));
}

// d/dx [x s(2u)] = s + 2 x s (1 - s) u', s = sigmoid(2u) = 1 / (1 + e),
// e = e^-2u, u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2); 1 - s is written
// e s, which keeps its precision where s is near 1.
PT_HOST_DEVICE inline float GeluGrad(float x, float dy) {
  const float kAlpha = 0.7978845608028654f;
  const float x2 = x * x;
  const float inner = kAlpha * (x + 0.044715f * x2 * x);
  const float e = ExpClamped(-2.0f * inner);
  const float s = 1.0f / (1.0f + e);
  const float dinner = kAlpha * (1.0f + 3.0f * 0.044715f * x2);
  return dy * (s + 2.0f * x * (e * s) * s * dinner);
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
