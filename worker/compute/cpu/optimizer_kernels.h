// The CPU backend's optimizer updates over a range of elements, one pool
// chunk at a time, vectorized: scalars are plain parameters and the arrays
// restrict pointers, so the compiler neither reloads a scalar per element
// nor fears that a store to w changes m (a lambda capturing by reference
// left the loop scalar: the SGD update of a 10 M-parameter stage took
// about 3x the time of its memory traffic). The arithmetic per element is
// math::SgdStep's and math::AdamWStep's. Thread-compatible: each call
// touches only [begin, end).
#ifndef PIPETRAIN_WORKER_COMPUTE_CPU_OPTIMIZER_KERNELS_H_
#define PIPETRAIN_WORKER_COMPUTE_CPU_OPTIMIZER_KERNELS_H_

#include <cstdint>

namespace pipetrain {
namespace cpu_kernels {

// SGD (with momentum when m is set and momentum != 0) over [begin, end).
void SgdRange(int64_t begin, int64_t end, float* __restrict w,
              const float* __restrict g, float* __restrict m, float lr,
              float momentum, float weight_decay, float grad_scale);

// AdamW over [begin, end); bias1 and bias2 are the bias corrections.
void AdamWRange(int64_t begin, int64_t end, float* __restrict w,
                const float* __restrict g, float* __restrict m,
                float* __restrict v, float lr, float beta1, float beta2,
                float eps, float weight_decay, float bias1, float bias2,
                float grad_scale);

}  // namespace cpu_kernels
}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COMPUTE_CPU_OPTIMIZER_KERNELS_H_
