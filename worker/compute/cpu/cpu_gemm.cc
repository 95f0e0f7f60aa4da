#include "worker/compute/cpu/cpu_gemm.h"

#include <cblas.h>

#include <cstdlib>
#include <string_view>
#include <vector>

#include "worker/compute/cpu/blas_kernels.h"
#include "worker/compute/cpu/packed_gemm.h"

namespace pipetrain {
namespace {

// Gemm(A, B^T) with at most kFewRows rows in A and both other sides at
// least kWideSide runs as (B A^T)^T (CpuGemm::FewRowsTimesTransposed).
// Measured on one and two threads: faster from 16 to 64 rows, slower at
// 256.
constexpr int64_t kFewRows = 64;
constexpr int64_t kWideSide = 256;
// The scratch buffer (n x m floats, kept per thread) stays under 16 MiB.
constexpr int64_t kMaxScratchRows = (int64_t{1} << 22) / kFewRows;

// Where OpenBLAS runs pre-AVX2 kernels, products of at least this many
// multiply-adds go to the packed kernel whatever their sides; below it
// (an attention head's 64 x 16 x 64) packing op(B) for one call is a large
// share of the work.
constexpr int64_t kMinPackedProduct = int64_t{1} << 20;

// Column panels (16 columns each) per thread of a packed GEMM or pack:
// below 2 x 8 panels it runs on one thread.
constexpr int64_t kPanelGrain = 8;

// Whether PackOperand packs: on a CPU the kernel runs on, unless the
// environment sets PIPETRAIN_PACKED_GEMM=0 (every product then goes to
// OpenBLAS; for comparisons, bench_scaling's unpacked runs).
bool PacksOperands() {
  const char* env = std::getenv("PIPETRAIN_PACKED_GEMM");
  if (env != nullptr && std::string_view(env) == "0") return false;
  return packed_gemm::PackedGemmSupported();
}

CBLAS_TRANSPOSE Trans(bool t) { return t ? CblasTrans : CblasNoTrans; }

}  // namespace

CpuGemm::CpuGemm(ParallelFor* pool)
    : pool_(pool),
      packs_(PacksOperands()),
      packs_wide_(packs_ && std::getenv("PIPETRAIN_PACKED_WIDE") == nullptr &&
                  packed_gemm::BestIsa() == packed_gemm::Isa::kAvx512),
      packs_every_large_(packs_wide_ && BlasRunsPreAvx2Kernels()) {}

absl::Status CpuGemm::Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n,
                           int64_t k, float alpha, const float* a, int64_t lda,
                           const float* b, int64_t ldb, float beta, float* c,
                           int64_t ldc) {
  if (m == 0 || n == 0) return absl::OkStatus();
  const bool large =
      (m >= kWideSide && n >= kWideSide && (trans_a || k >= kWideSide)) ||
      (packs_every_large_ && m * n * k >= kMinPackedProduct);
  if (packs_wide_ && alpha == 1.0f && (beta == 0.0f || beta == 1.0f) && large) {
    return GemmPackingB(
        trans_a, trans_b, m, n, k, a, lda, b, ldb,
        beta == 0.0f ? packed_gemm::Sum::kWrite : packed_gemm::Sum::kAdd, c,
        ldc);
  }
  if (!trans_a && trans_b && m <= kFewRows && n >= kWideSide &&
      k >= kWideSide && n <= kMaxScratchRows) {
    return FewRowsTimesTransposed(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  cblas_sgemm(CblasRowMajor, Trans(trans_a), Trans(trans_b), m, n, k, alpha, a,
              lda, b, ldb, beta, c, ldc);
  return absl::OkStatus();
}

absl::StatusOr<bool> CpuGemm::PackOperand(bool trans_b, int64_t k, int64_t n,
                                          const float* b, int64_t ldb,
                                          PackedOperand* packed) {
  if (!packs_) return false;
  packed->k = k;
  packed->n = n;
  packed->data.resize(static_cast<size_t>(packed_gemm::PackedSize(k, n)));
  float* out = packed->data.data();
  pool_->Run(packed_gemm::PanelCount(n), kPanelGrain,
             [&](int64_t begin, int64_t end) {
               packed_gemm::Pack(trans_b, k, n, b, ldb, begin, end, out);
             });
  return true;
}

absl::Status CpuGemm::GemmPacked(int64_t m, const float* a, int64_t lda,
                                 const PackedOperand& packed, float* c,
                                 int64_t ldc) {
  if (!packs_ || static_cast<int64_t>(packed.data.size()) !=
                     packed_gemm::PackedSize(packed.k, packed.n)) {
    return absl::FailedPreconditionError(
        "GemmPacked needs an operand from this backend's PackOperand");
  }
  const float* data = packed.data.data();
  pool_->Run(packed_gemm::PanelCount(packed.n), kPanelGrain,
             [&](int64_t begin, int64_t end) {
               packed_gemm::Multiply(m, packed.k, packed.n, a, lda, data, begin,
                                     end, c, ldc);
             });
  return absl::OkStatus();
}

bool CpuGemm::ResumesSums(bool trans_a, bool, int64_t m, int64_t n,
                          int64_t max_k) const {
  // Gemm's `large` holds for these whatever k, so the first part (beta 0)
  // and a single call over every row take the packed kernel too.
  return packs_wide_ && trans_a && m >= kWideSide && n >= kWideSide &&
         max_k <= packed_gemm::kDepthBlock;
}

absl::Status CpuGemm::GemmResume(bool trans_a, bool trans_b, int64_t m,
                                 int64_t n, int64_t k, const float* a,
                                 int64_t lda, const float* b, int64_t ldb,
                                 float* c, int64_t ldc) {
  if (!ResumesSums(trans_a, trans_b, m, n, k)) {
    return absl::FailedPreconditionError(
        "GemmResume: this product's sums cannot be resumed (ResumesSums)");
  }
  if (m == 0 || n == 0 || k == 0) return absl::OkStatus();
  return GemmPackingB(trans_a, trans_b, m, n, k, a, lda, b, ldb,
                      packed_gemm::Sum::kResume, c, ldc);
}

absl::Status CpuGemm::GemmStridedBatched(bool trans_a, bool trans_b, int64_t m,
                                         int64_t n, int64_t k, float alpha,
                                         const float* a, int64_t lda,
                                         int64_t stride_a, const float* b,
                                         int64_t ldb, int64_t stride_b,
                                         float beta, float* c, int64_t ldc,
                                         int64_t stride_c, int64_t batch) {
  for (int64_t i = 0; i < batch; ++i) {
    cblas_sgemm(CblasRowMajor, Trans(trans_a), Trans(trans_b), m, n, k, alpha,
                a + i * stride_a, lda, b + i * stride_b, ldb, beta,
                c + i * stride_c, ldc);
  }
  return absl::OkStatus();
}

// C (+)= op(A) op(B) for a large product through the AVX-512 packed
// kernel, op(B) packed for this call: a pass over B against m x n x k
// multiply-adds. bench_compute, one thread, against OpenBLAS's AVX2
// kernels: a weight gradient (A^T B, k = 32 micro-batch rows) 122 vs 88
// GFLOP/s, and the whole-batch training step 1.15x.
absl::Status CpuGemm::GemmPackingB(bool trans_a, bool trans_b, int64_t m,
                                   int64_t n, int64_t k, const float* a,
                                   int64_t lda, const float* b, int64_t ldb,
                                   packed_gemm::Sum sum, float* c,
                                   int64_t ldc) {
  thread_local std::vector<float> packed;
  packed.resize(static_cast<size_t>(packed_gemm::PackedSize(k, n)));
  float* out = packed.data();
  const int64_t panels = packed_gemm::PanelCount(n);
  pool_->Run(panels, kPanelGrain, [&](int64_t begin, int64_t end) {
    packed_gemm::Pack(trans_b, k, n, b, ldb, begin, end, out);
  });
  pool_->Run(panels, kPanelGrain, [&](int64_t begin, int64_t end) {
    packed_gemm::MultiplyWith(packed_gemm::Isa::kAvx512, m, k, n, a, lda,
                              trans_a, out, begin, end, c, ldc, sum);
  });
  return absl::OkStatus();
}

// C = alpha A B^T + beta C with few rows in A (a micro-batch's input
// gradient, dx = dy W^T): OpenBLAS runs this shape at 0.7-0.8 of the
// rate it reaches on C^T = B A^T (measured at 32 x 2048 x 2048: 49 vs 61
// GFLOP/s on one thread, 87 vs 121 on two). So
// C^T goes into a scratch buffer and is transposed into C: n x m floats,
// a few hundred KiB, against n x k x m multiply-adds.
absl::Status CpuGemm::FewRowsTimesTransposed(int64_t m, int64_t n, int64_t k,
                                             float alpha, const float* a,
                                             int64_t lda, const float* b,
                                             int64_t ldb, float beta, float* c,
                                             int64_t ldc) {
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<size_t>(n * m));
  float* t = scratch.data();  // C^T, n x m
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, m, k, alpha, b, ldb,
              a, lda, 0.0f, t, m);
  for (int64_t i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    if (beta == 0.0f) {  // C may hold garbage (NaN): never read it
      for (int64_t j = 0; j < n; ++j) row[j] = t[j * m + i];
    } else {
      for (int64_t j = 0; j < n; ++j) row[j] = t[j * m + i] + beta * row[j];
    }
  }
  return absl::OkStatus();
}

}  // namespace pipetrain
