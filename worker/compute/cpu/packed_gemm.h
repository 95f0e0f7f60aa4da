// A GEMM whose right-hand operand is laid out once and reused.
//
// A stage multiplies every micro-batch of a step by the same weight
// matrices. OpenBLAS lays both operands out anew in every call; for a
// micro-batch of 32 rows against a 2048 x 2048 weight, that repacking is a
// pass over the whole weight for 32 rows of work, and the product ran at
// about 0.75 of the rate of one 256-row call (bench_compute's
// `packed_vs_openblas` figures). Here op(B) is packed once into column
// panels of kPanelWidth, split into blocks of kDepthBlock rows, and each
// product streams the panels through an AVX2/FMA register kernel of up to
// 6 x 16 outputs. Each output element sums its k products in the same
// order whatever the number of rows, so a row's result does not depend on
// how the batch was split.
//
// Needs a CPU with AVX2 and FMA (PackedGemmSupported); callers fall back to
// cblas_sgemm elsewhere. Thread-compatible: the functions keep no state but
// a per-thread scratch buffer.
#ifndef PIPETRAIN_WORKER_COMPUTE_CPU_PACKED_GEMM_H_
#define PIPETRAIN_WORKER_COMPUTE_CPU_PACKED_GEMM_H_

#include <cstdint>

namespace pipetrain {
namespace packed_gemm {

inline constexpr int64_t kPanelWidth = 16;
inline constexpr int64_t kDepthBlock = 256;

// True when this CPU runs the kernel (x86-64 with AVX2 and FMA).
bool PackedGemmSupported();

// Floats a packed [k, n] operand takes (n rounded up to whole panels).
int64_t PackedSize(int64_t k, int64_t n);
// Column panels of a packed operand with n columns.
inline int64_t PanelCount(int64_t n) {
  return (n + kPanelWidth - 1) / kPanelWidth;
}

// Packs panels [panel_begin, panel_end) of op(B) ([k, n]; B is stored
// [k, n] with row stride ldb, or [n, k] when trans_b) into `out`
// (PackedSize(k, n) floats). Padding columns are zero.
void Pack(bool trans_b, int64_t k, int64_t n, const float* b, int64_t ldb,
          int64_t panel_begin, int64_t panel_end, float* out);

// C[:, columns of panels [panel_begin, panel_end)] = A[m, k] op(B), with
// `packed` from Pack. A and C are row-major with strides lda and ldc; C is
// written, never read. Requires PackedGemmSupported().
void Multiply(int64_t m, int64_t k, int64_t n, const float* a, int64_t lda,
              const float* packed, int64_t panel_begin, int64_t panel_end,
              float* c, int64_t ldc);

}  // namespace packed_gemm
}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COMPUTE_CPU_PACKED_GEMM_H_
