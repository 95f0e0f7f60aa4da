#include "worker/compute/cpu/optimizer_kernels.h"

#include "worker/compute/elementwise_math.h"

namespace pipetrain {
namespace cpu_kernels {

void SgdRange(int64_t begin, int64_t end, float* __restrict w,
              const float* __restrict g, float* __restrict m, float lr,
              float momentum, float weight_decay, float grad_scale) {
  if (m != nullptr && momentum != 0.0f) {
    for (int64_t i = begin; i < end; ++i) {
      math::SgdStep(&w[i], g[i], &m[i], lr, momentum, weight_decay, grad_scale);
    }
  } else {
    for (int64_t i = begin; i < end; ++i) {
      math::SgdStep(&w[i], g[i], nullptr, lr, 0.0f, weight_decay, grad_scale);
    }
  }
}

void AdamWRange(int64_t begin, int64_t end, float* __restrict w,
                const float* __restrict g, float* __restrict m,
                float* __restrict v, float lr, float beta1, float beta2,
                float eps, float weight_decay, float bias1, float bias2,
                float grad_scale) {
  for (int64_t i = begin; i < end; ++i) {
    math::AdamWStep(&w[i], g[i], &m[i], &v[i], lr, beta1, beta2, eps,
                    weight_decay, bias1, bias2, grad_scale);
  }
}

}  // namespace cpu_kernels
}  // namespace pipetrain
