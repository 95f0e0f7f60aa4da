// The CPU backend's element-wise loops with transcendental functions (GELU,
// softmax's exponentials), one pool chunk or row at a time. Each is
// compiled three times, for AVX-512, AVX2 and baseline x86-64, and the
// dynamic loader picks the widest the CPU runs (target_clones); all three
// are built without FMA contraction, so they give the same bits on every
// machine. The arithmetic per element is math::Gelu's, math::GeluGrad's
// and math::ExpClamped's (elementwise_math.h), which the CUDA kernels also
// call. Thread-compatible: each call touches only its own range.
#ifndef PIPETRAIN_WORKER_COMPUTE_CPU_ELEMENTWISE_KERNELS_H_
#define PIPETRAIN_WORKER_COMPUTE_CPU_ELEMENTWISE_KERNELS_H_

#include <cstdint>

namespace pipetrain {
namespace cpu_kernels {

// y[i] = GELU(x[i]) for i in [begin, end).
void GeluForwardRange(int64_t begin, int64_t end, const float* x, float* y);

// dx[i] = GELU'(x[i]) dy[i] for i in [begin, end).
void GeluBackwardRange(int64_t begin, int64_t end, const float* x,
                       const float* dy, float* dx);

// out[i] = e^(in[i] - shift) for i in [0, n) (softmax's exponentials),
// exactly 0 where in[i] - shift < -87, as libm's expf nearly is there
// (e^-87 = 1.6e-38; below it denormals, then 0).
void ExpShifted(int64_t n, const float* in, float shift, float* out);

}  // namespace cpu_kernels
}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COMPUTE_CPU_ELEMENTWISE_KERNELS_H_
