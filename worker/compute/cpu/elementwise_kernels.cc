#include "worker/compute/cpu/elementwise_kernels.h"

#include "worker/compute/elementwise_math.h"

// One version per vector width, chosen at load time by the CPU it runs on.
#if defined(__x86_64__)
#define PT_VECTOR_CLONES \
  __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PT_VECTOR_CLONES
#endif

namespace pipetrain {
namespace cpu_kernels {

PT_VECTOR_CLONES void GeluForwardRange(int64_t begin, int64_t end,
                                       const float* x, float* y) {
  for (int64_t i = begin; i < end; ++i) y[i] = math::Gelu(x[i]);
}

PT_VECTOR_CLONES void GeluBackwardRange(int64_t begin, int64_t end,
                                        const float* x, const float* dy,
                                        float* dx) {
  for (int64_t i = begin; i < end; ++i) dx[i] = math::GeluGrad(x[i], dy[i]);
}

PT_VECTOR_CLONES void ExpShifted(int64_t n, const float* in, float shift,
                                 float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = in[i] - shift;
    out[i] = x < -87.0f ? 0.0f : math::ExpClamped(x);
  }
}

}  // namespace cpu_kernels
}  // namespace pipetrain
