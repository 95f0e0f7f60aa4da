// A GEMM whose right-hand operand is laid out once and reused.
//
// A stage multiplies every micro-batch of a step by the same weight
// matrices. OpenBLAS lays both operands out anew in every call; for a
// micro-batch of 32 rows against a 2048 x 2048 weight, that repacking is a
// pass over the whole weight for 32 rows of work, and the product ran at
// about 0.75 of the rate of one 256-row call (bench_compute's
// `packed_vs_openblas` figures). Here op(B) is packed once into column
// panels of kPanelWidth, split into blocks of kDepthBlock rows, and each
// product streams the panels through a register kernel: up to 14 x 32
// outputs with AVX-512, else up to 6 x 16 with AVX2/FMA. Each output
// element sums its k products in the same order whatever the number of
// rows and whichever kernel, so a row's result does not depend on how the
// batch was split, and both kernels give the same bits.
//
// Needs a CPU with AVX2 and FMA (PackedGemmSupported); callers fall back to
// cblas_sgemm elsewhere. PIPETRAIN_PACKED_GEMM_ISA=avx2 keeps an AVX-512
// CPU on the AVX2 kernel (for comparisons). Thread-compatible: the
// functions keep no state but a per-thread scratch buffer.
#ifndef PIPETRAIN_WORKER_COMPUTE_CPU_PACKED_GEMM_H_
#define PIPETRAIN_WORKER_COMPUTE_CPU_PACKED_GEMM_H_

#include <cstdint>

namespace pipetrain {
namespace packed_gemm {

inline constexpr int64_t kPanelWidth = 16;
inline constexpr int64_t kDepthBlock = 256;

// The register kernels.
enum class Isa { kNone, kAvx2, kAvx512 };

// The kernel Multiply uses on this CPU: AVX-512 where the CPU has it
// (unless PIPETRAIN_PACKED_GEMM_ISA=avx2), else AVX2 with FMA, else none.
Isa BestIsa();
// Whether this CPU runs `isa`'s kernel.
bool IsaSupported(Isa isa);

// True when this CPU runs a kernel (x86-64 with AVX2 and FMA).
inline bool PackedGemmSupported() { return BestIsa() != Isa::kNone; }

// Floats a packed [k, n] operand takes (n rounded up to whole panels).
int64_t PackedSize(int64_t k, int64_t n);
// Column panels of a packed operand with n columns.
inline int64_t PanelCount(int64_t n) {
  return (n + kPanelWidth - 1) / kPanelWidth;
}

// Packs panels [panel_begin, panel_end) of op(B) ([k, n]; B is stored
// [k, n] with row stride ldb, or [n, k] when trans_b) into `out`
// (PackedSize(k, n) floats). Padding columns are zero.
// Whole panels move with AVX where the CPU has AVX2 (bench_compute, one
// 2048 x 2048 weight, one thread: 0.91 ms for W and 1.03 ms for W^T,
// against 1.66 and 2.55 ms a float at a time).
void Pack(bool trans_b, int64_t k, int64_t n, const float* b, int64_t ldb,
          int64_t panel_begin, int64_t panel_end, float* out);
// Pack a float at a time, on any CPU: the same bytes.
void PackPortable(bool trans_b, int64_t k, int64_t n, const float* b,
                  int64_t ldb, int64_t panel_begin, int64_t panel_end,
                  float* out);

// C[:, columns of panels [panel_begin, panel_end)] = A[m, k] op(B), with
// `packed` from Pack. A and C are row-major with strides lda and ldc; C is
// written, never read. Requires PackedGemmSupported().
void Multiply(int64_t m, int64_t k, int64_t n, const float* a, int64_t lda,
              const float* packed, int64_t panel_begin, int64_t panel_end,
              float* c, int64_t ldc);
// Multiply with a chosen kernel; requires IsaSupported(isa).
void MultiplyWith(Isa isa, int64_t m, int64_t k, int64_t n, const float* a,
                  int64_t lda, const float* packed, int64_t panel_begin,
                  int64_t panel_end, float* c, int64_t ldc);
// How a product meets what C holds.
enum class Sum {
  kWrite,  // C = the product; C is never read
  kAdd,    // C = C + the product (each output's sum over k, then added)
  // Each output's sum carries on from the value C holds, as if the products
  // that made it came first in the same sum: a kWrite over the first k0
  // rows of op(A) and op(B), then a kResume over the rest, gives the bits
  // of one kWrite over all of them, when k0 + k <= kDepthBlock. Past the
  // first depth block of this call, later blocks add as kAdd does.
  kResume,
};

// The general form: C (+)= op(A) op(B), op(A) = A [m, k] or, with trans_a,
// A^T (A stored [k, m] with row stride lda). `sum` says how the product
// meets C (kWrite: C is written, never read).
void MultiplyWith(Isa isa, int64_t m, int64_t k, int64_t n, const float* a,
                  int64_t lda, bool trans_a, const float* packed,
                  int64_t panel_begin, int64_t panel_end, float* c, int64_t ldc,
                  Sum sum);

}  // namespace packed_gemm
}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COMPUTE_CPU_PACKED_GEMM_H_
