#include "worker/compute/cpu/packed_gemm.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#define PIPETRAIN_PACKED_GEMM_X86 1
#endif

namespace pipetrain {
namespace packed_gemm {
namespace {

// Rows of C per register kernel: 6 x 16 outputs in AVX2's 16 registers,
// 14 x 32 in AVX-512's 32 (28 accumulators, two panel rows, a broadcast).
// A 32-row micro-batch goes in three row groups (14, 9, 9) rather than four
// of 8, so each panel pair is read by one group fewer (bench_compute's
// 32-row packed forward: 0.89-1.02 of the 256-row rate, against 0.84-0.88
// with groups of 8; docs/ARCHITECTURE.md).
constexpr int64_t kAvx2Rows = 6;
constexpr int64_t kAvx512Rows = 14;
// Half of a core's L2 (1 MiB on the CPUs measured; smaller ones lose only
// speed): the most of op(B) the AVX-512 path keeps there across row groups.
constexpr int64_t kHalfL2Bytes = 512 * 1024;

// Rows of the row group starting at i: groups of max_rows, the last two
// groups balanced (with 6, 32 rows go 6, 6, 6, 6, 4, 4 rather than ending
// in a 2-row group, which runs at a third of the kernel's rate).
int64_t GroupRows(int64_t m, int64_t i, int64_t max_rows) {
  const int64_t left = m - i;
  if (left <= max_rows) return left;
  if (left < 2 * max_rows) return (left + 1) / 2;
  return max_rows;
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

void PackPortable(bool trans_b, int64_t k, int64_t n, const float* b,
                  int64_t ldb, int64_t panel_begin, int64_t panel_end,
                  float* out) {
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

namespace {

#if defined(PIPETRAIN_PACKED_GEMM_X86)

// dst[q * dst_stride + r] = rows[r][q] for r, q in [0, 8): an 8 x 8 block
// transposed in registers.
__attribute__((target("avx2"))) inline void Transpose8x8(
    const float* const* rows, float* dst, int64_t dst_stride) {
  __m256 r[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(rows[i]);
  __m256 t[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // s[0..3]: columns 0-3 of rows 0-3 (and 4-7 of them in the high lane);
  // s[4..7] the same of rows 4-7.
  __m256 s[8];
  for (int h = 0; h < 2; ++h) {
    s[4 * h + 0] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
    s[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
    s[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
    s[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
  }
  for (int q = 0; q < 4; ++q) {
    _mm256_storeu_ps(dst + q * dst_stride,
                     _mm256_permute2f128_ps(s[q], s[q + 4], 0x20));
    _mm256_storeu_ps(dst + (q + 4) * dst_stride,
                     _mm256_permute2f128_ps(s[q], s[q + 4], 0x31));
  }
}

// Pack with AVX: whole panels move 16 floats at a time, transposed ones
// in 8 x 8 register blocks (bench_compute, a 2048 x 2048 weight: 1.85x
// and 2.42x the portable form); partial panels go the portable way and
// depth tails a float at a time. The same bytes as PackPortable.
__attribute__((target("avx2"))) void PackAvx2(bool trans_b, int64_t k,
                                              int64_t n, const float* b,
                                              int64_t ldb, int64_t panel_begin,
                                              int64_t panel_end, float* out) {
  const int64_t whole_end = std::min(panel_end, n / kPanelWidth);
  for (int64_t p0 = 0; p0 < k; p0 += kDepthBlock) {
    const int64_t kc = std::min(kDepthBlock, k - p0);
    for (int64_t j = panel_begin; j < whole_end; ++j) {
      const int64_t col = j * kPanelWidth;
      float* panel = out + PanelOffset(n, p0, kc, j);
      if (!trans_b) {
        const float* src = b + p0 * ldb + col;
        for (int64_t p = 0; p < kc; ++p) {
          _mm256_storeu_ps(panel + p * kPanelWidth,
                           _mm256_loadu_ps(src + p * ldb));
          _mm256_storeu_ps(panel + p * kPanelWidth + 8,
                           _mm256_loadu_ps(src + p * ldb + 8));
        }
        continue;
      }
      const float* rows[kPanelWidth];
      for (int64_t c = 0; c < kPanelWidth; ++c) {
        rows[c] = b + (col + c) * ldb + p0;
      }
      int64_t p = 0;
      for (; p + 8 <= kc; p += 8) {
        const float* block[8];
        for (int half = 0; half < 2; ++half) {
          for (int c = 0; c < 8; ++c) block[c] = rows[8 * half + c] + p;
          Transpose8x8(block, panel + p * kPanelWidth + 8 * half, kPanelWidth);
        }
      }
      for (; p < kc; ++p) {
        for (int64_t c = 0; c < kPanelWidth; ++c) {
          panel[p * kPanelWidth + c] = rows[c][p];
        }
      }
    }
  }
  if (whole_end < panel_end) {
    PackPortable(trans_b, k, n, b, ldb, std::max(panel_begin, whole_end),
                 panel_end, out);
  }
}

#endif  // PIPETRAIN_PACKED_GEMM_X86

}  // namespace

void Pack(bool trans_b, int64_t k, int64_t n, const float* b, int64_t ldb,
          int64_t panel_begin, int64_t panel_end, float* out) {
#if defined(PIPETRAIN_PACKED_GEMM_X86)
  static const bool avx2 = IsaSupported(Isa::kAvx2);
  if (avx2) {
    PackAvx2(trans_b, k, n, b, ldb, panel_begin, panel_end, out);
    return;
  }
#endif
  PackPortable(trans_b, k, n, b, ldb, panel_begin, panel_end, out);
}

#if defined(PIPETRAIN_PACKED_GEMM_X86)

Isa BestIsa() {
  static const Isa best = [] {
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
      return Isa::kNone;
    }
    const char* env = std::getenv("PIPETRAIN_PACKED_GEMM_ISA");
    if (env != nullptr && std::string_view(env) == "avx2") return Isa::kAvx2;
    return __builtin_cpu_supports("avx512f") ? Isa::kAvx512 : Isa::kAvx2;
  }();
  return best;
}

bool IsaSupported(Isa isa) {
  switch (isa) {
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f");
    case Isa::kNone:
      break;
  }
  return false;
}

namespace {

// C[R rows, width columns] (+)= A-group (kc x R, interleaved) x panel
// (kc x 16), meeting C as `sum` says (kAdd: a later depth block).
// Prefetches the kc lines at `prefetch` (the next panel, or this one).
template <int R>
__attribute__((target("avx2,fma"))) inline void Kernel(
    int64_t kc, const float* a, const float* panel, const float* prefetch,
    float* c, int64_t ldc, Sum sum, int64_t width) {
  __m256 lo[R];
  __m256 hi[R];
  alignas(32) float tile[kPanelWidth];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    if (sum != Sum::kResume) {
      lo[r] = _mm256_setzero_ps();
      hi[r] = _mm256_setzero_ps();
      continue;
    }
    // The sums go on from C's values (the padding columns from zero).
    const float* row = c + r * ldc;
    if (width == kPanelWidth) {
      lo[r] = _mm256_loadu_ps(row);
      hi[r] = _mm256_loadu_ps(row + 8);
      continue;
    }
    for (int64_t q = 0; q < kPanelWidth; ++q) tile[q] = q < width ? row[q] : 0;
    lo[r] = _mm256_load_ps(tile);
    hi[r] = _mm256_load_ps(tile + 8);
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
      if (sum == Sum::kAdd) {
        lo[r] = _mm256_add_ps(lo[r], _mm256_loadu_ps(row));
        hi[r] = _mm256_add_ps(hi[r], _mm256_loadu_ps(row + 8));
      }
      _mm256_storeu_ps(row, lo[r]);
      _mm256_storeu_ps(row + 8, hi[r]);
    }
    return;
  }
  // Unrolled like the loops above: a loop indexing lo/hi by a variable
  // would keep them in memory, and GCC would then store every accumulator
  // at every step of the main loop.
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm256_store_ps(tile, lo[r]);
    _mm256_store_ps(tile + 8, hi[r]);
    float* row = c + r * ldc;
    for (int64_t q = 0; q < width; ++q) {
      row[q] = sum == Sum::kAdd ? row[q] + tile[q] : tile[q];
    }
  }
}

__attribute__((target("avx2,fma"))) void RunKernel(
    int64_t rows, int64_t kc, const float* a, const float* panel,
    const float* prefetch, float* c, int64_t ldc, Sum sum, int64_t width) {
  switch (rows) {
    case 6:
      return Kernel<6>(kc, a, panel, prefetch, c, ldc, sum, width);
    case 5:
      return Kernel<5>(kc, a, panel, prefetch, c, ldc, sum, width);
    case 4:
      return Kernel<4>(kc, a, panel, prefetch, c, ldc, sum, width);
    case 3:
      return Kernel<3>(kc, a, panel, prefetch, c, ldc, sum, width);
    case 2:
      return Kernel<2>(kc, a, panel, prefetch, c, ldc, sum, width);
    default:
      return Kernel<1>(kc, a, panel, prefetch, c, ldc, sum, width);
  }
}

// The AVX-512 kernel: C[R rows, P panels] (+)= A-group (kc x R,
// interleaved) x P adjacent panels (each kc x 16, `stride` floats apart).
// One 16-lane register per row and panel. The last panel's `width` columns
// are stored (a mask); the others are whole. Each output sums its kc
// products in the same order as Kernel's, so both kernels give the same
// bits. Prefetches the kc lines of each of the P panels at `prefetch`.
template <int R, int P>
__attribute__((target("avx512f"))) inline void Kernel512(
    int64_t kc, const float* a, const float* panel, int64_t stride,
    const float* prefetch, float* c, int64_t ldc, Sum sum, int64_t width) {
  const __mmask16 last = static_cast<__mmask16>((1u << width) - 1);
  __m512 acc[R][P];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int q = 0; q < P; ++q) {
      const __mmask16 mask = q == P - 1 ? last : static_cast<__mmask16>(0xffff);
      // kResume: the sums go on from C's values (the padding from zero).
      acc[r][q] = sum == Sum::kResume ? _mm512_maskz_loadu_ps(
                                            mask, c + r * ldc + q * kPanelWidth)
                                      : _mm512_setzero_ps();
    }
  }
  for (int64_t p = 0; p < kc; ++p) {
    __m512 b[P];
#pragma GCC unroll 2
    for (int q = 0; q < P; ++q) {
      _mm_prefetch(reinterpret_cast<const char*>(prefetch + q * stride +
                                                 p * kPanelWidth),
                   _MM_HINT_T0);
      b[q] = _mm512_loadu_ps(panel + q * stride + p * kPanelWidth);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a[p * R + r]);
#pragma GCC unroll 2
      for (int q = 0; q < P; ++q)
        acc[r][q] = _mm512_fmadd_ps(x, b[q], acc[r][q]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int q = 0; q < P; ++q) {
      const __mmask16 mask = q == P - 1 ? last : static_cast<__mmask16>(0xffff);
      float* out = c + r * ldc + q * kPanelWidth;
      if (sum == Sum::kAdd) {
        acc[r][q] = _mm512_add_ps(acc[r][q], _mm512_maskz_loadu_ps(mask, out));
      }
      _mm512_mask_storeu_ps(out, mask, acc[r][q]);
    }
  }
}

using Kernel512Fn = void (*)(int64_t, const float*, const float*, int64_t,
                             const float*, float*, int64_t, Sum, int64_t);

// Kernel512<R, P> for R = 1 .. kAvx512Rows, indexed by R - 1.
template <int P, int... R>
constexpr std::array<Kernel512Fn, sizeof...(R)> Kernel512Table(
    std::integer_sequence<int, R...>) {
  return {&Kernel512<R + 1, P>...};
}

template <int P>
void RunKernel512(int64_t rows, int64_t kc, const float* a, const float* panel,
                  int64_t stride, const float* prefetch, float* c, int64_t ldc,
                  Sum sum, int64_t width) {
  static constexpr auto kTable = Kernel512Table<P>(
      std::make_integer_sequence<int, static_cast<int>(kAvx512Rows)>());
  kTable[std::clamp<int64_t>(rows, 1, kAvx512Rows) - 1](
      kc, a, panel, stride, prefetch, c, ldc, sum, width);
}

// One depth block (kc rows of op(B), every row of A interleaved in
// `a_block`) through the AVX-512 kernel, two panels (32 columns) at a time
// and a last odd panel alone. The order of the tiles follows what stays in
// cache: with a block of op(B) small enough for half of L2 (a weight
// gradient's: kc = 32 micro-batch rows), row group by row group, so that C
// is written row by row (panel by panel over 2048 rows of C, every store
// went to another page: 0.4x the rate); else panel by panel, each panel
// pair kept in L1 across the row groups. The order changes no output's
// arithmetic.
__attribute__((target("avx512f"))) void Avx512DepthBlock(
    int64_t m, int64_t n, int64_t kc, const float* a_block, const float* block,
    int64_t panel_begin, int64_t panel_end, float* c, int64_t ldc, Sum sum) {
  const int64_t stride = kc * kPanelWidth;
  auto tile = [&](int64_t i, int64_t rows, int64_t j, int64_t panels,
                  const float* prefetch) {
    const float* panel = block + j * stride;
    const int64_t width =
        std::min(kPanelWidth, n - (j + panels - 1) * kPanelWidth);
    const float* a_group = a_block + i * kc;
    float* out = c + i * ldc + j * kPanelWidth;
    if (panels == 2) {
      RunKernel512<2>(rows, kc, a_group, panel, stride, prefetch, out, ldc, sum,
                      width);
    } else {
      RunKernel512<1>(rows, kc, a_group, panel, stride, prefetch, out, ldc, sum,
                      width);
    }
  };
  auto pair = [&](int64_t j) { return panel_end - j >= 2 ? 2 : 1; };
  const int64_t block_bytes =
      kc * (panel_end - panel_begin) * kPanelWidth * sizeof(float);
  if (block_bytes <= kHalfL2Bytes) {
    for (int64_t i = 0, rows = 0; i < m; i += rows) {
      rows = GroupRows(m, i, kAvx512Rows);
      for (int64_t j = panel_begin, panels = 0; j < panel_end; j += panels) {
        panels = pair(j);
        tile(i, rows, j, panels, block + (j + panels) * stride);
      }
    }
    return;
  }
  for (int64_t j = panel_begin, panels = 0; j < panel_end; j += panels) {
    panels = pair(j);
    for (int64_t i = 0, rows = 0; i < m; i += rows) {
      rows = GroupRows(m, i, kAvx512Rows);
      // The first group pulls the next panels into cache while it works.
      tile(i, rows, j, panels, block + (i == 0 ? j + panels : j) * stride);
    }
  }
}

}  // namespace

void Multiply(int64_t m, int64_t k, int64_t n, const float* a, int64_t lda,
              const float* packed, int64_t panel_begin, int64_t panel_end,
              float* c, int64_t ldc) {
  MultiplyWith(BestIsa(), m, k, n, a, lda, packed, panel_begin, panel_end, c,
               ldc);
}

void MultiplyWith(Isa isa, int64_t m, int64_t k, int64_t n, const float* a,
                  int64_t lda, const float* packed, int64_t panel_begin,
                  int64_t panel_end, float* c, int64_t ldc) {
  MultiplyWith(isa, m, k, n, a, lda, /*trans_a=*/false, packed, panel_begin,
               panel_end, c, ldc, Sum::kWrite);
}

void MultiplyWith(Isa isa, int64_t m, int64_t k, int64_t n, const float* a,
                  int64_t lda, bool trans_a, const float* packed,
                  int64_t panel_begin, int64_t panel_end, float* c, int64_t ldc,
                  Sum sum) {
  if (m <= 0 || panel_begin >= panel_end) return;
  if (k == 0) {  // an empty sum
    if (sum != Sum::kWrite) return;
    const int64_t col0 = panel_begin * kPanelWidth;
    const int64_t cols = std::min(n, panel_end * kPanelWidth) - col0;
    for (int64_t i = 0; i < m; ++i) {
      std::fill(c + i * ldc + col0, c + i * ldc + col0 + cols, 0.0f);
    }
    return;
  }
  const int64_t max_rows = isa == Isa::kAvx512 ? kAvx512Rows : kAvx2Rows;
  // A's depth block, each row group's kc x R values interleaved.
  thread_local std::vector<float> a_block;
  a_block.resize(static_cast<size_t>(m * std::min(k, kDepthBlock)));
  for (int64_t p0 = 0; p0 < k; p0 += kDepthBlock) {
    const int64_t kc = std::min(kDepthBlock, k - p0);
    for (int64_t i = 0, rows = 0; i < m; i += rows) {
      rows = GroupRows(m, i, max_rows);
      float* group = a_block.data() + i * kc;
      for (int64_t p = 0; p < kc; ++p) {
        for (int64_t r = 0; r < rows; ++r) {
          group[p * rows + r] =
              trans_a ? a[(p0 + p) * lda + i + r] : a[(i + r) * lda + p0 + p];
        }
      }
    }
    if (isa == Isa::kAvx512) {
      Avx512DepthBlock(m, n, kc, a_block.data(),
                       packed + PanelOffset(n, p0, kc, 0), panel_begin,
                       panel_end, c, ldc, p0 > 0 ? Sum::kAdd : sum);
      continue;
    }
    for (int64_t j = panel_begin; j < panel_end; ++j) {
      const float* panel = packed + PanelOffset(n, p0, kc, j);
      const float* next = panel + kc * kPanelWidth;
      const int64_t col = j * kPanelWidth;
      const int64_t width = std::min(kPanelWidth, n - col);
      for (int64_t i = 0, rows = 0; i < m; i += rows) {
        rows = GroupRows(m, i, max_rows);
        // The first group pulls the next panel into cache while it works.
        RunKernel(rows, kc, a_block.data() + i * kc, panel,
                  i == 0 ? next : panel, c + i * ldc + col, ldc,
                  p0 > 0 ? Sum::kAdd : sum, width);
      }
    }
  }
}

#else  // not x86-64

Isa BestIsa() { return Isa::kNone; }
bool IsaSupported(Isa) { return false; }

// Callers check PackedGemmSupported() first; reaching this is a bug.
void Multiply(int64_t, int64_t, int64_t, const float*, int64_t, const float*,
              int64_t, int64_t, float*, int64_t) {
  std::abort();
}
void MultiplyWith(Isa, int64_t, int64_t, int64_t, const float*, int64_t,
                  const float*, int64_t, int64_t, float*, int64_t) {
  std::abort();
}
void MultiplyWith(Isa, int64_t, int64_t, int64_t, const float*, int64_t, bool,
                  const float*, int64_t, int64_t, float*, int64_t, Sum) {
  std::abort();
}

#endif

}  // namespace packed_gemm
}  // namespace pipetrain
