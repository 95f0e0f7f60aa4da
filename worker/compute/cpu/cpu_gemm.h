// The CPU backend's matrix products: which kernel each GEMM shape goes to
// (the AVX-512 packed kernel for large products, a transposed product for a
// few rows times a transposed wide matrix, OpenBLAS otherwise), and the
// operands packed once for products that reuse them (Backend::PackOperand).
//
// Thread-compatible: one caller at a time (the backend's compute thread),
// like the ParallelFor it runs on.
#ifndef PIPETRAIN_WORKER_COMPUTE_CPU_CPU_GEMM_H_
#define PIPETRAIN_WORKER_COMPUTE_CPU_CPU_GEMM_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/compute/backend.h"
#include "worker/compute/cpu/packed_gemm.h"
#include "worker/compute/cpu/parallel_for.h"

namespace pipetrain {

class CpuGemm {
 public:
  // Runs on `pool` (not owned; outlives this). Packs operands on a CPU the
  // packed kernel runs on, unless the environment sets
  // PIPETRAIN_PACKED_GEMM=0 (every product then goes to OpenBLAS; for
  // comparisons, bench_scaling's unpacked runs); large products go to the
  // packed kernel with AVX-512 only, unless PIPETRAIN_PACKED_WIDE is set.
  explicit CpuGemm(ParallelFor* pool);

  // Whether PackOperand packs.
  bool packs() const { return packs_; }

  // The Backend calls of the same names (worker/compute/backend.h).
  absl::Status Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                    float alpha, const float* a, int64_t lda, const float* b,
                    int64_t ldb, float beta, float* c, int64_t ldc);
  absl::StatusOr<bool> PackOperand(bool trans_b, int64_t k, int64_t n,
                                   const float* b, int64_t ldb,
                                   PackedOperand* packed);
  absl::Status GemmPacked(int64_t m, const float* a, int64_t lda,
                          const PackedOperand& packed, float* c, int64_t ldc);
  // Products that Gemm sends to the packed kernel whatever their depth
  // (trans_a, both sides at least kWideSide, AVX-512) and whose depth fits
  // one of its depth blocks: its kResume continues their sums exactly.
  bool ResumesSums(bool trans_a, bool trans_b, int64_t m, int64_t n,
                   int64_t max_k) const;
  absl::Status GemmResume(bool trans_a, bool trans_b, int64_t m, int64_t n,
                          int64_t k, const float* a, int64_t lda,
                          const float* b, int64_t ldb, float* c, int64_t ldc);
  absl::Status GemmStridedBatched(bool trans_a, bool trans_b, int64_t m,
                                  int64_t n, int64_t k, float alpha,
                                  const float* a, int64_t lda, int64_t stride_a,
                                  const float* b, int64_t ldb, int64_t stride_b,
                                  float beta, float* c, int64_t ldc,
                                  int64_t stride_c, int64_t batch);

 private:
  absl::Status GemmPackingB(bool trans_a, bool trans_b, int64_t m, int64_t n,
                            int64_t k, const float* a, int64_t lda,
                            const float* b, int64_t ldb, packed_gemm::Sum sum,
                            float* c, int64_t ldc);
  absl::Status FewRowsTimesTransposed(int64_t m, int64_t n, int64_t k,
                                      float alpha, const float* a, int64_t lda,
                                      const float* b, int64_t ldb, float beta,
                                      float* c, int64_t ldc);

  ParallelFor* const pool_;
  const bool packs_;
  // Gemm runs large products through the packed kernel: with AVX-512 only
  // (OpenBLAS's AVX2 kernels match the AVX2 one on such products).
  const bool packs_wide_;
  // And every product of at least kMinPackedProduct multiply-adds, whatever
  // its sides, where OpenBLAS runs kernels older than AVX2
  // (BlasRunsPreAvx2Kernels): the character LM's 64-wide products.
  const bool packs_every_large_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COMPUTE_CPU_CPU_GEMM_H_
