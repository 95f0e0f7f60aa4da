#include "worker/compute/cpu/packed_gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#define PIPETRAIN_PACKED_GEMM_X86 1
#endif

namespace pipetrain {
namespace packed_gemm {
namespace {

constexpr int64_t kMaxRows = 6;  // rows of C per register kernel

// Rows of the row group starting at i: groups of 6, the last two groups
// balanced (32 rows go 6, 6, 6, 6, 4, 4 rather than ending in a 2-row
// group, which runs at a third of the kernel's rate).
int64_t GroupRows(int64_t m, int64_t i) {
  const int64_t left = m - i;
  if (left <= kMaxRows) return left;
  if (left < 2 * kMaxRows) return (left + 1) / 2;
  return kMaxRows;
}

// Offset of block `p0` (its first row of op(B)), panel j, in a packed
// operand: every block before it is kDepthBlock rows of all panels.
int64_t PanelOffset(int64_t n, int64_t p0, int64_t kc, int64_t j) {
  return p0 * PanelCount(n) * kPanelWidth + j * kc * kPanelWidth;
}

}  // namespace

int64_t PackedSize(int64_t k, int64_t n) {
  return k * PanelCount(n) * kPanelWidth;
}

void Pack(bool trans_b, int64_t k, int64_t n, const float* b, int64_t ldb,
          int64_t panel_begin, int64_t panel_end, float* out) {
  for (int64_t p0 = 0; p0 < k; p0 += kDepthBlock) {
    const int64_t kc = std::min(kDepthBlock, k - p0);
    for (int64_t j = panel_begin; j < panel_end; ++j) {
      const int64_t col = j * kPanelWidth;
      const int64_t width = std::min(kPanelWidth, n - col);
      float* panel = out + PanelOffset(n, p0, kc, j);
      if (!trans_b) {
        for (int64_t p = 0; p < kc; ++p) {
          float* dst = panel + p * kPanelWidth;
          std::memcpy(dst, b + (p0 + p) * ldb + col, width * sizeof(float));
          std::fill(dst + width, dst + kPanelWidth, 0.0f);
        }
        continue;
      }
      // op(B)[p][col + c] = B[col + c][p]: each stored row's kc values in
      // order.
      for (int64_t c = 0; c < kPanelWidth; ++c) {
        if (c >= width) {
          for (int64_t p = 0; p < kc; ++p) panel[p * kPanelWidth + c] = 0.0f;
          continue;
        }
        const float* src = b + (col + c) * ldb + p0;
        for (int64_t p = 0; p < kc; ++p) panel[p * kPanelWidth + c] = src[p];
      }
    }
  }
}

#if defined(PIPETRAIN_PACKED_GEMM_X86)

bool PackedGemmSupported() {
  static const bool supported =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return supported;
}

namespace {

// C[R rows, width columns] (+)= A-group (kc x R, interleaved) x panel
// (kc x 16). Accumulates into C when `accumulate` (a later depth block).
// Prefetches the kc lines at `prefetch` (the next panel, or this one).
template <int R>
__attribute__((target("avx2,fma"))) inline void Kernel(
    int64_t kc, const float* a, const float* panel, const float* prefetch,
    float* c, int64_t ldc, bool accumulate, int64_t width) {
  __m256 lo[R];
  __m256 hi[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    lo[r] = _mm256_setzero_ps();
    hi[r] = _mm256_setzero_ps();
  }
  for (int64_t p = 0; p < kc; ++p) {
    _mm_prefetch(reinterpret_cast<const char*>(prefetch + p * kPanelWidth),
                 _MM_HINT_T0);
    const __m256 b0 = _mm256_loadu_ps(panel + p * kPanelWidth);
    const __m256 b1 = _mm256_loadu_ps(panel + p * kPanelWidth + 8);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 x = _mm256_broadcast_ss(a + p * R + r);
      lo[r] = _mm256_fmadd_ps(x, b0, lo[r]);
      hi[r] = _mm256_fmadd_ps(x, b1, hi[r]);
    }
  }
  if (width == kPanelWidth) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      float* row = c + r * ldc;
      if (accumulate) {
        lo[r] = _mm256_add_ps(lo[r], _mm256_loadu_ps(row));
        hi[r] = _mm256_add_ps(hi[r], _mm256_loadu_ps(row + 8));
      }
      _mm256_storeu_ps(row, lo[r]);
      _mm256_storeu_ps(row + 8, hi[r]);
    }
    return;
  }
  alignas(32) float tile[kPanelWidth];
  // Unrolled like the loops above: a loop indexing lo/hi by a variable
  // would keep them in memory, and GCC would then store every accumulator
  // at every step of the main loop.
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm256_store_ps(tile, lo[r]);
    _mm256_store_ps(tile + 8, hi[r]);
    float* row = c + r * ldc;
    for (int64_t q = 0; q < width; ++q) {
      row[q] = accumulate ? row[q] + tile[q] : tile[q];
    }
  }
}

__attribute__((target("avx2,fma"))) void RunKernel(
    int64_t rows, int64_t kc, const float* a, const float* panel,
    const float* prefetch, float* c, int64_t ldc, bool accumulate,
    int64_t width) {
  switch (rows) {
    case 6:
      return Kernel<6>(kc, a, panel, prefetch, c, ldc, accumulate, width);
    case 5:
      return Kernel<5>(kc, a, panel, prefetch, c, ldc, accumulate, width);
    case 4:
      return Kernel<4>(kc, a, panel, prefetch, c, ldc, accumulate, width);
    case 3:
      return Kernel<3>(kc, a, panel, prefetch, c, ldc, accumulate, width);
    case 2:
      return Kernel<2>(kc, a, panel, prefetch, c, ldc, accumulate, width);
    default:
      return Kernel<1>(kc, a, panel, prefetch, c, ldc, accumulate, width);
  }
}

}  // namespace

void Multiply(int64_t m, int64_t k, int64_t n, const float* a, int64_t lda,
              const float* packed, int64_t panel_begin, int64_t panel_end,
              float* c, int64_t ldc) {
  if (m <= 0 || panel_begin >= panel_end) return;
  if (k == 0) {  // an empty sum
    const int64_t col0 = panel_begin * kPanelWidth;
    const int64_t cols = std::min(n, panel_end * kPanelWidth) - col0;
    for (int64_t i = 0; i < m; ++i) {
      std::fill(c + i * ldc + col0, c + i * ldc + col0 + cols, 0.0f);
    }
    return;
  }
  // A's depth block, each row group's kc x R values interleaved.
  thread_local std::vector<float> a_block;
  a_block.resize(static_cast<size_t>(m * std::min(k, kDepthBlock)));
  for (int64_t p0 = 0; p0 < k; p0 += kDepthBlock) {
    const int64_t kc = std::min(kDepthBlock, k - p0);
    for (int64_t i = 0, rows = 0; i < m; i += rows) {
      rows = GroupRows(m, i);
      float* group = a_block.data() + i * kc;
      for (int64_t p = 0; p < kc; ++p) {
        for (int64_t r = 0; r < rows; ++r) {
          group[p * rows + r] = a[(i + r) * lda + p0 + p];
        }
      }
    }
    for (int64_t j = panel_begin; j < panel_end; ++j) {
      const float* panel = packed + PanelOffset(n, p0, kc, j);
      const float* next = panel + kc * kPanelWidth;
      const int64_t col = j * kPanelWidth;
      const int64_t width = std::min(kPanelWidth, n - col);
      for (int64_t i = 0, rows = 0; i < m; i += rows) {
        rows = GroupRows(m, i);
        // The first group pulls the next panel into cache while it works.
        RunKernel(rows, kc, a_block.data() + i * kc, panel,
                  i == 0 ? next : panel, c + i * ldc + col, ldc, p0 > 0, width);
      }
    }
  }
}

#else  // not x86-64

bool PackedGemmSupported() { return false; }

// Callers check PackedGemmSupported() first; reaching this is a bug.
void Multiply(int64_t, int64_t, int64_t, const float*, int64_t, const float*,
              int64_t, int64_t, float*, int64_t) {
  std::abort();
}

#endif

}  // namespace packed_gemm
}  // namespace pipetrain
