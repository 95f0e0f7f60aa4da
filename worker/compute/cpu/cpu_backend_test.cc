// Checks the CPU backend against direct definitions. (Gradients are checked
// by finite differences in the layer tests.)
#include "worker/compute/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "worker/compute/cpu/packed_gemm.h"
#include "worker/compute/elementwise_math.h"

namespace pipetrain {
namespace {

class CpuBackendTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend_ = CreateCpuBackend(2);
};

TEST_F(CpuBackendTest, AllocationsThatCannotBeHadAreResourceExhausted) {
  const int64_t big = int64_t{1} << 40;
  EXPECT_EQ(backend_->Allocate({big, big}).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(backend_->AllocateUninitialized({int64_t{1} << 62}).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(backend_->Allocate({-2, 3}).status().code(),
            absl::StatusCode::kResourceExhausted);
  absl::StatusOr<Tensor> ok = backend_->Allocate({3, 5});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->numel(), 15);
}

TEST_F(CpuBackendTest, GemmMatchesNaiveProductForEveryTranspose) {
  const int m = 3, n = 4, k = 5;
  std::vector<float> a(m * k), b(k * n);
  for (int i = 0; i < m * k; ++i) a[i] = 0.1f * i - 0.7f;
  for (int i = 0; i < k * n; ++i) b[i] = 0.05f * i + 0.3f;
  // Stored transposes of a and b.
  std::vector<float> at(k * m), bt(n * k);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < k; ++j) at[j * m + i] = a[i * k + j];
  for (int i = 0; i < k; ++i)
    for (int j = 0; j < n; ++j) bt[j * k + i] = b[i * n + j];
  std::vector<float> want(m * n, 0.0f);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j)
      for (int p = 0; p < k; ++p)
        want[i * n + j] += a[i * k + p] * b[p * n + j];
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      std::vector<float> c(m * n, 1.0f);
      ASSERT_TRUE(backend_
                      ->Gemm(ta, tb, m, n, k, 1.0f, ta ? at.data() : a.data(),
                             ta ? m : k, tb ? bt.data() : b.data(), tb ? k : n,
                             0.5f, c.data(), n)
                      .ok());
      for (int i = 0; i < m * n; ++i) {
        EXPECT_NEAR(c[i], want[i] + 0.5f, 1e-5) << ta << tb << i;
      }
    }
  }
}

// A micro-batch's input gradient (few rows times a wide transposed
// matrix) takes its own route through the backend; it must give the same
// product, honour alpha, beta and leading dimensions, and never read C when
// beta is 0.
TEST_F(CpuBackendTest, FewRowsTimesAWideTransposedMatrixMatchesNaiveProduct) {
  for (int m : {1, 7, 32, 64}) {
    for (float beta : {0.0f, 0.5f}) {
      const int n = 300, k = 260, lda = k + 3, ldb = k + 1, ldc = n + 5;
      std::vector<float> a(m * lda), b(n * ldb);
      for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37f * i);
      for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.11f * i);
      std::vector<float> c(m * ldc), want(m * ldc);
      for (size_t i = 0; i < c.size(); ++i) {
        c[i] = beta == 0.0f ? std::nanf("") : 0.25f * (i % 9);
        want[i] = c[i];
      }
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
          double dot = 0;
          for (int p = 0; p < k; ++p) {
            dot += static_cast<double>(a[i * lda + p]) * b[j * ldb + p];
          }
          want[i * ldc + j] = static_cast<float>(
              1.5 * dot + (beta == 0.0f ? 0.0 : beta * c[i * ldc + j]));
        }
      }
      ASSERT_TRUE(backend_
                      ->Gemm(false, true, m, n, k, 1.5f, a.data(), lda,
                             b.data(), ldb, beta, c.data(), ldc)
                      .ok());
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < ldc; ++j) {
          const float got = c[i * ldc + j], w = want[i * ldc + j];
          if (j >= n) {  // past the row's end: untouched
            EXPECT_TRUE(got == w || (std::isnan(got) && std::isnan(w)));
          } else {
            EXPECT_NEAR(got, w, 1e-3)
                << "m=" << m << " beta=" << beta << " at " << i << "," << j;
          }
        }
      }
    }
  }
}

// The sides of a product and the padding added to each operand's row
// stride.
struct Product {
  int m, n, k;
  int pad_a = 0, pad_b = 0, pad_c = 0;
};

// C (+)= op(A) op(B) through `backend` for every transpose and beta 0 (C
// never read) and 1, against a double-precision product within
// `tolerance`; the columns past each row's end of C stay untouched.
void ExpectProductsMatchADoubleProduct(Backend* backend, const Product& s,
                                       double tolerance) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (float beta : {0.0f, 1.0f}) {
        const int lda = (ta ? s.m : s.k) + s.pad_a;
        const int ldb = (tb ? s.k : s.n) + s.pad_b;
        const int ldc = s.n + s.pad_c;
        std::vector<float> a((ta ? s.k : s.m) * lda);
        std::vector<float> b((tb ? s.n : s.k) * ldb);
        for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37f * i);
        for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.11f * i);
        std::vector<float> c(s.m * ldc);
        for (size_t i = 0; i < c.size(); ++i) {
          c[i] = beta == 0.0f ? std::nanf("") : 0.25f * (i % 9);
        }
        const std::vector<float> before = c;
        ASSERT_TRUE(backend
                        ->Gemm(ta, tb, s.m, s.n, s.k, 1.0f, a.data(), lda,
                               b.data(), ldb, beta, c.data(), ldc)
                        .ok());
        for (int i = 0; i < s.m; ++i) {
          for (int j = 0; j < ldc; ++j) {
            const float got = c[i * ldc + j];
            if (j >= s.n) {  // past the row's end: untouched
              ASSERT_TRUE(std::isnan(got) || got == before[i * ldc + j]);
              continue;
            }
            double want = beta == 0.0f ? 0.0 : before[i * ldc + j];
            for (int p = 0; p < s.k; ++p) {
              const double av = ta ? a[p * lda + i] : a[i * lda + p];
              want += av * (tb ? b[j * ldb + p] : b[p * ldb + j]);
            }
            ASSERT_NEAR(got, want, tolerance)
                << "m=" << s.m << " n=" << s.n << " k=" << s.k << " ta=" << ta
                << " tb=" << tb << " beta=" << beta << " at " << i << "," << j;
          }
        }
      }
    }
  }
}

// Large products go through the packed kernel when the CPU has AVX-512
// (CpuGemm::GemmPackingB; a weight gradient's shape, A^T B, also when
// shallow): every transpose, beta 0 (C never read) and 1, padded strides,
// against a double-precision product. On other CPUs the same calls check
// OpenBLAS.
TEST_F(CpuBackendTest, LargeProductsMatchADoubleProduct) {
  for (int k : {32, 300}) {
    ExpectProductsMatchADoubleProduct(backend_.get(), {260, 270, k, 3, 1, 5},
                                      1e-3);
  }
}

// Products with a side under 256 but over 2^20 multiply-adds (the
// character LM's 64-wide layers) go through the packed kernel where
// OpenBLAS runs pre-AVX2 kernels (CpuGemm::packs_every_large_), else to
// OpenBLAS: either way they match a double-precision product, with every
// transpose and beta 0 and 1.
TEST_F(CpuBackendTest, NarrowLargeProductsMatchADoubleProduct) {
  for (const Product& s :
       {Product{64, 40, 600}, Product{500, 24, 96}, Product{40, 300, 128}}) {
    ExpectProductsMatchADoubleProduct(backend_.get(), s, 2e-3);
  }
}

// The optimizer updates run vectorized over many elements (and over the
// pool's chunks); each element must get exactly the scalar update.
TEST_F(CpuBackendTest, OptimizerUpdatesEqualTheScalarStepOnEveryElement) {
  for (int64_t n : {int64_t{1}, int64_t{1003}, int64_t{100003}}) {
    std::vector<float> w(n), g(n), m(n), v(n);
    for (int64_t i = 0; i < n; ++i) {
      w[i] = std::sin(0.3f * i);
      g[i] = std::cos(0.7f * i);
      m[i] = 0.01f * (i % 13);
      v[i] = 0.001f * (i % 7);
    }
    for (bool momentum : {false, true}) {
      std::vector<float> w2 = w, m2 = m, want_w = w, want_m = m;
      const float mu = momentum ? 0.9f : 0.0f;
      for (int64_t i = 0; i < n; ++i) {
        math::SgdStep(&want_w[i], g[i], momentum ? &want_m[i] : nullptr, 0.05f,
                      mu, 0.01f, 0.5f);
      }
      ASSERT_TRUE(backend_
                      ->SgdUpdate(n, w2.data(), g.data(),
                                  momentum ? m2.data() : nullptr, 0.05f, mu,
                                  0.01f, 0.5f)
                      .ok());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(w2[i], want_w[i]) << "sgd n=" << n << " i=" << i;
        ASSERT_EQ(m2[i], want_m[i]) << "sgd n=" << n << " i=" << i;
      }
    }
    std::vector<float> w2 = w, m2 = m, v2 = v, want_w = w, want_m = m,
                       want_v = v;
    for (int64_t i = 0; i < n; ++i) {
      math::AdamWStep(&want_w[i], g[i], &want_m[i], &want_v[i], 1e-3f, 0.9f,
                      0.999f, 1e-8f, 0.01f, 0.19f, 0.002f, 0.5f);
    }
    ASSERT_TRUE(backend_
                    ->AdamWUpdate(n, w2.data(), g.data(), m2.data(), v2.data(),
                                  1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.19f,
                                  0.002f, 0.5f)
                    .ok());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(w2[i], want_w[i]) << "adamw n=" << n << " i=" << i;
      ASSERT_EQ(m2[i], want_m[i]) << "adamw n=" << n << " i=" << i;
      ASSERT_EQ(v2[i], want_v[i]) << "adamw n=" << n << " i=" << i;
    }
  }
}

// GELU (tanh approximation) and its derivative against long-double
// references: 0.5 x (1 + tanh(u)) written as x / (1 + e^-2u), the same
// function (checked below) without tanh's cancellation near -1.
TEST_F(CpuBackendTest, GeluAndItsGradientMatchALongDoubleReference) {
  const auto inner = [](long double x) {
    return 0.7978845608028654L * (x + 0.044715L * x * x * x);
  };
  for (const long double u : {-3.0L, -0.4L, 0.0L, 0.25L, 2.0L}) {
    ASSERT_NEAR(static_cast<double>(0.5L * (1 + tanhl(u))),
                static_cast<double>(1 / (1 + expl(-2 * u))), 1e-15);
  }
  std::vector<float> x;
  for (float v = -12.0f; v < 12.0f; v += 1.0f / 512) x.push_back(v);
  for (const float v : {-90.0f, -30.0f, 30.0f, 90.0f, 1e-20f, -1e-20f}) {
    x.push_back(v);
  }
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> dy(n), y(n), dx(n);
  for (int64_t i = 0; i < n; ++i) dy[i] = 0.5f + 0.25f * (i % 5);
  ASSERT_TRUE(backend_->GeluForward(n, x.data(), y.data()).ok());
  ASSERT_TRUE(backend_->GeluBackward(n, x.data(), dy.data(), dx.data()).ok());
  for (int64_t i = 0; i < n; ++i) {
    const long double xi = x[i], u = inner(xi);
    const long double e = expl(-2 * u), s = 1 / (1 + e);
    const long double want = xi * s;
    // d/dx x s(2u) = s + 2 x s (1 - s) u'.
    const long double want_grad =
        dy[i] * (s + 2 * xi * s * (1 - s) * 0.7978845608028654L *
                         (1 + 3 * 0.044715L * xi * xi));
    // The float evaluation of u limits the relative error where e^-2u is
    // far from 1 (|x| > 4); below 1e-30 only the absolute error counts.
    const double rel = std::fabs(x[i]) < 4 ? 2e-6 : 2e-5;
    ASSERT_NEAR(y[i], static_cast<double>(want),
                rel * std::fabs(static_cast<double>(want)) + 1e-30)
        << "x = " << x[i];
    ASSERT_NEAR(dx[i], static_cast<double>(want_grad),
                1e-6 * (1 + std::fabs(static_cast<double>(want_grad))))
        << "x = " << x[i];
  }
}

// The backend runs GELU in a loop compiled for the widest vectors the CPU
// has; it gives the bits of the plain scalar formula, so every machine
// computes the same activations.
TEST_F(CpuBackendTest, GeluGivesTheScalarFormulasBitsOnThisCpu) {
  const int64_t n = 100003;
  std::vector<float> x(n), dy(n), y(n), dx(n);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = 8.0f * std::sin(0.37f * static_cast<float>(i));
    dy[i] = std::cos(0.11f * static_cast<float>(i));
  }
  ASSERT_TRUE(backend_->GeluForward(n, x.data(), y.data()).ok());
  ASSERT_TRUE(backend_->GeluBackward(n, x.data(), dy.data(), dx.data()).ok());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(y[i], math::Gelu(x[i])) << "x = " << x[i];
    ASSERT_EQ(dx[i], math::GeluGrad(x[i], dy[i])) << "x = " << x[i];
  }
}

TEST_F(CpuBackendTest, CausalSoftmaxMasksTheFuture) {
  const int t = 3;
  std::vector<float> x(t * t, 1.0f), y(t * t);
  ASSERT_TRUE(backend_->SoftmaxForward(t, t, t, x.data(), y.data()).ok());
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_NEAR(y[3], 0.5f, 1e-7);
  EXPECT_NEAR(y[8], 1.0f / 3, 1e-7);
}

// Softmax rows (plain and causal) against a long-double reference, with
// logits spread over 200 so that some probabilities fall below e^-87 (0
// there, as in float).
TEST_F(CpuBackendTest, SoftmaxMatchesALongDoubleReference) {
  const int64_t rows = 64, cols = 256;
  std::vector<float> x(rows * cols), y(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) {
    const float t = static_cast<float>(i);
    x[i] = (i / cols) % 2 == 0 ? 6.0f * std::sin(0.7f * t)
                               : 100.0f * std::sin(0.3f * t);
  }
  for (const int64_t causal_t : {int64_t{0}, int64_t{16}}) {
    ASSERT_TRUE(
        backend_->SoftmaxForward(rows, cols, causal_t, x.data(), y.data())
            .ok());
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t valid =
          causal_t > 0 ? std::min(cols, r % causal_t + 1) : cols;
      long double max_v = x[r * cols];
      for (int64_t c = 0; c < valid; ++c) {
        max_v = std::max<long double>(max_v, x[r * cols + c]);
      }
      long double sum = 0;
      for (int64_t c = 0; c < valid; ++c) sum += expl(x[r * cols + c] - max_v);
      for (int64_t c = 0; c < cols; ++c) {
        const long double d = x[r * cols + c] - max_v;
        const long double want = c < valid ? expl(d) / sum : 0.0L;
        // x - max rounds to float: relative error up to 2^-24 |x - max|.
        const double rel = 1e-6 + 1.2e-7 * std::fabs(static_cast<double>(d));
        ASSERT_NEAR(y[r * cols + c], static_cast<double>(want),
                    rel * static_cast<double>(want) + 1e-37)
            << "row " << r << " col " << c << " causal " << causal_t;
        // Where even a float's denormals end, exactly 0.
        if (d < -104) {
          ASSERT_EQ(y[r * cols + c], 0.0f) << "row " << r << " col " << c;
        }
      }
    }
  }
}

TEST_F(CpuBackendTest, CrossEntropyRejectsBadLabels) {
  std::vector<float> logits = {1, 2, 3, 4}, labels = {1, 2};
  std::vector<float> probs(4), loss(2), correct(2);
  auto status =
      backend_->SoftmaxCrossEntropy(2, 2, logits.data(), labels.data(),
                                    probs.data(), loss.data(), correct.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("row 1"), std::string::npos) << status;
  labels = {1, 0};
  ASSERT_TRUE(backend_
                  ->SoftmaxCrossEntropy(2, 2, logits.data(), labels.data(),
                                        probs.data(), loss.data(),
                                        correct.data())
                  .ok());
  EXPECT_NEAR(loss[0], std::log(1 + std::exp(-1.0f)), 1e-6);
  EXPECT_EQ(correct[0], 1.0f);
  EXPECT_EQ(correct[1], 0.0f);
}

TEST_F(CpuBackendTest, PermuteSwapsMiddleDimensions) {
  // [1, 2, 3, 1] -> perm (0, 2, 1, 3) -> [1, 3, 2, 1].
  std::vector<float> in = {0, 1, 2, 3, 4, 5}, out(6);
  Permute4 p{{1, 2, 3, 1}, {0, 2, 1, 3}};
  ASSERT_TRUE(backend_->Permute(p, in.data(), out.data()).ok());
  EXPECT_EQ(out, (std::vector<float>{0, 3, 1, 4, 2, 5}));
}

TEST_F(CpuBackendTest, ColumnSumAndSumSquares) {
  std::vector<float> x = {1, 2, 3, 4, 5, 6};  // [2, 3]
  std::vector<float> out = {10, 10, 10};
  ASSERT_TRUE(backend_->ColumnSum(2, 3, x.data(), 1.0f, out.data()).ok());
  EXPECT_EQ(out, (std::vector<float>{15, 17, 19}));
  auto ss = backend_->SumSquares(6, x.data());
  ASSERT_TRUE(ss.ok());
  EXPECT_DOUBLE_EQ(*ss, 91.0);
}

TEST_F(CpuBackendTest, DropoutKeepsExpectedFractionAndIsReproducible) {
  const int n = 100000;
  std::vector<float> x(n, 1.0f), y1(n), y2(n);
  ASSERT_TRUE(backend_->Dropout(n, x.data(), 0.25f, 7, y1.data()).ok());
  ASSERT_TRUE(backend_->Dropout(n, x.data(), 0.25f, 7, y2.data()).ok());
  EXPECT_EQ(y1, y2);
  int kept = 0;
  for (float v : y1) kept += v != 0.0f;
  EXPECT_NEAR(kept / static_cast<double>(n), 0.75, 0.01);
  EXPECT_NEAR(y1[0] == 0.0f ? y1[1] + y1[2] : y1[0], 1.0f / 0.75f, 1.0);
}

// The packed path against a double-precision product, over shapes that
// cover partial panels, several depth blocks, every row-group size and
// padded strides, on one and two threads.
TEST(CpuBackendPackedGemmTest, MatchesADoubleProductForEveryShapeAndLayout) {
  for (int threads : {1, 2}) {
    std::unique_ptr<Backend> backend = CreateCpuBackend(threads);
    PackedOperand probe;
    absl::StatusOr<bool> supported = backend->PackOperand(
        false, 1, 1, std::vector<float>{1.0f}.data(), 1, &probe);
    ASSERT_TRUE(supported.ok());
    if (!*supported) GTEST_SKIP() << "this CPU has no AVX2/FMA";
    for (int64_t m : {1, 5, 7, 8, 9, 13, 17, 32}) {
      for (int64_t n : {1, 10, 16, 33, 300}) {
        for (int64_t k : {1, 7, 256, 600}) {
          for (bool trans_b : {false, true}) {
            const int64_t lda = k + 3, ldb = (trans_b ? k : n) + 2, ldc = n + 5;
            std::vector<float> a(m * lda), b((trans_b ? n : k) * ldb);
            for (size_t i = 0; i < a.size(); ++i) {
              a[i] = std::sin(0.37f * i);
            }
            for (size_t i = 0; i < b.size(); ++i) {
              b[i] = std::cos(0.11f * i);
            }
            // NaN before: C is written, never read; the stride's padding
            // stays untouched.
            std::vector<float> c(m * ldc, std::nanf(""));
            PackedOperand packed;
            ASSERT_TRUE(
                *backend->PackOperand(trans_b, k, n, b.data(), ldb, &packed));
            ASSERT_TRUE(
                backend->GemmPacked(m, a.data(), lda, packed, c.data(), ldc)
                    .ok());
            for (int64_t i = 0; i < m; ++i) {
              for (int64_t j = 0; j < ldc; ++j) {
                const float got = c[i * ldc + j];
                if (j >= n) {
                  ASSERT_TRUE(std::isnan(got)) << "padding written";
                  continue;
                }
                double want = 0;
                for (int64_t p = 0; p < k; ++p) {
                  const float bv = trans_b ? b[j * ldb + p] : b[p * ldb + j];
                  want += static_cast<double>(a[i * lda + p]) * bv;
                }
                ASSERT_NEAR(got, want, 1e-4 * (1 + std::sqrt(double(k))))
                    << "threads " << threads << " m " << m << " n " << n
                    << " k " << k << " trans_b " << trans_b << " at " << i
                    << "," << j;
              }
            }
          }
        }
      }
    }
  }
}

// A row's result does not depend on how many rows share the call: a
// micro-batch gives bit for bit the rows the whole batch gives.
TEST(CpuBackendPackedGemmTest, ARowsResultDoesNotDependOnTheBatchSplit) {
  std::unique_ptr<Backend> backend = CreateCpuBackend(1);
  const int64_t m = 32, n = 70, k = 530;
  std::vector<float> a(m * k), b(k * n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.7f * i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.3f * i);
  PackedOperand packed;
  absl::StatusOr<bool> supported =
      backend->PackOperand(false, k, n, b.data(), n, &packed);
  ASSERT_TRUE(supported.ok());
  if (!*supported) GTEST_SKIP() << "this CPU has no AVX2/FMA";
  std::vector<float> whole(m * n), split(m * n);
  ASSERT_TRUE(
      backend->GemmPacked(m, a.data(), k, packed, whole.data(), n).ok());
  for (int64_t i = 0; i < m; i += 8) {  // 8 rows at a time, as micro-batches
    ASSERT_TRUE(backend
                    ->GemmPacked(8, a.data() + i * k, k, packed,
                                 split.data() + i * n, n)
                    .ok());
  }
  EXPECT_EQ(whole, split);
}

// The AVX-512 kernel (14 x 32 outputs) and the AVX2 kernel (6 x 16) sum
// each output's products in the same order: the same bits, for every
// row-group size, a last partial panel, an odd panel left over, several
// depth blocks, and column ranges split as the backend's threads split
// them. (The test above checks whichever kernel this CPU runs against a
// double-precision product; with this one, both are checked.)
TEST(CpuBackendPackedGemmTest, TheAvx512AndAvx2KernelsGiveTheSameBits) {
  using packed_gemm::Isa;
  if (!packed_gemm::IsaSupported(Isa::kAvx512) ||
      !packed_gemm::IsaSupported(Isa::kAvx2)) {
    GTEST_SKIP() << "this CPU lacks AVX-512 or AVX2/FMA";
  }
  // Every group size of either kernel (1 to 14 rows) alone, then
  // balanced groups (15: 8 + 7; 23: 12 + 11; 32: 14 + 9 + 9; 37: 14 + 12 +
  // 11 with AVX-512).
  std::vector<int64_t> rows(15);
  std::iota(rows.begin(), rows.end(), 1);
  rows.insert(rows.end(), {23, 32, 37});
  for (int64_t m : rows) {
    for (int64_t n : {5, 16, 48, 70, 300}) {
      for (int64_t k : {3, 256, 530}) {
        const int64_t lda = k + 1, ldc = n + 3;
        std::vector<float> a(m * lda), b(k * n);
        for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37f * i);
        for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.11f * i);
        const int64_t panels = packed_gemm::PanelCount(n);
        std::vector<float> packed(packed_gemm::PackedSize(k, n));
        packed_gemm::Pack(false, k, n, b.data(), n, 0, panels, packed.data());
        std::vector<float> wide(m * ldc, 0.0f), narrow(m * ldc, 0.0f);
        // Two column ranges, the first of an odd number of panels.
        const int64_t cut = panels / 2 | 1;
        for (auto [begin, end] :
             {std::pair<int64_t, int64_t>{0, std::min(cut, panels)},
              {std::min(cut, panels), panels}}) {
          packed_gemm::MultiplyWith(Isa::kAvx512, m, k, n, a.data(), lda,
                                    packed.data(), begin, end, wide.data(),
                                    ldc);
          packed_gemm::MultiplyWith(Isa::kAvx2, m, k, n, a.data(), lda,
                                    packed.data(), begin, end, narrow.data(),
                                    ldc);
        }
        ASSERT_EQ(wide, narrow) << "m " << m << " n " << n << " k " << k;
        // And the product is a product (the kernels could agree on a wrong
        // one): one element against a double-precision sum.
        double want = 0;
        for (int64_t p = 0; p < k; ++p) {
          want += static_cast<double>(a[(m - 1) * lda + p]) * b[p * n + n - 1];
        }
        ASSERT_NEAR(wide[(m - 1) * ldc + n - 1], want,
                    1e-4 * (1 + std::sqrt(double(k))));
      }
    }
  }
}

// Pack lays op(B) out as documented: depth blocks of kDepthBlock rows, in
// each block 16-column panels of kc rows, padding columns zero; the
// vectorised form (whole panels, 8 x 8 transposes) and the portable one
// give those bytes for both layouts, partial panels, depth tails, several
// depth blocks, a row stride past the row, and panel ranges split as the
// backend's threads split them. The reference is built here from the
// layout, element by element.
TEST(CpuBackendPackedGemmTest, PackLaysOutEveryPanelAsDocumented) {
  using packed_gemm::kDepthBlock;
  using packed_gemm::kPanelWidth;
  for (const bool trans_b : {false, true}) {
    for (int64_t k : {1, 7, 8, 13, 256, 300, 530}) {
      for (int64_t n : {1, 15, 16, 17, 48, 70}) {
        const int64_t stored_cols = trans_b ? k : n;
        const int64_t ldb = stored_cols + 5;
        std::vector<float> b((trans_b ? n : k) * ldb);
        for (size_t i = 0; i < b.size(); ++i) b[i] = 0.25f * i + 1.0f;
        const int64_t panels = packed_gemm::PanelCount(n);
        std::vector<float> want(packed_gemm::PackedSize(k, n), -1.0f);
        for (int64_t p0 = 0; p0 < k; p0 += kDepthBlock) {
          const int64_t kc = std::min(kDepthBlock, k - p0);
          for (int64_t j = 0; j < panels; ++j) {
            for (int64_t p = 0; p < kc; ++p) {
              for (int64_t c = 0; c < kPanelWidth; ++c) {
                const int64_t row = p0 + p, col = j * kPanelWidth + c;
                float v = 0.0f;
                if (col < n)
                  v = trans_b ? b[col * ldb + row] : b[row * ldb + col];
                want[p0 * panels * kPanelWidth + j * kc * kPanelWidth +
                     p * kPanelWidth + c] = v;
              }
            }
          }
        }
        const int64_t cut = panels / 2 | 1;
        std::vector<float> fast(want.size(), -2.0f),
            portable(want.size(), -3.0f);
        for (auto [begin, end] :
             {std::pair<int64_t, int64_t>{0, std::min(cut, panels)},
              {std::min(cut, panels), panels}}) {
          packed_gemm::Pack(trans_b, k, n, b.data(), ldb, begin, end,
                            fast.data());
          packed_gemm::PackPortable(trans_b, k, n, b.data(), ldb, begin, end,
                                    portable.data());
        }
        ASSERT_EQ(fast, want)
            << "trans_b " << trans_b << " k " << k << " n " << n;
        ASSERT_EQ(portable, want)
            << "trans_b " << trans_b << " k " << k << " n " << n;
      }
    }
  }
}

// An operand this backend did not pack is refused, not read.
// A sum split in two: kWrite over the first k0 rows of depth, then
// kResume over the rest, must give the bits of one kWrite over all k rows
// (both kernels, both layouts of A, every group size, partial panels,
// splits at the first and last row), and kAdd after kWrite must not (it
// rounds the two partial sums separately), which shows the comparison can
// tell them apart.
TEST(CpuBackendPackedGemmTest, AResumedSumHasTheBitsOfOneSum) {
  using packed_gemm::Isa;
  using packed_gemm::Sum;
  int differ = 0;
  for (const Isa isa : {Isa::kAvx512, Isa::kAvx2}) {
    if (!packed_gemm::IsaSupported(isa)) continue;
    for (const bool trans_a : {false, true}) {
      for (int64_t m : {1, 5, 9, 14, 15, 32}) {
        for (int64_t n : {16, 33, 70}) {
          const int64_t k = packed_gemm::kDepthBlock;
          for (int64_t k0 : {1, 32, 224, 255}) {
            SCOPED_TRACE(::testing::Message()
                         << "isa " << static_cast<int>(isa) << " trans_a "
                         << trans_a << " m " << m << " n " << n << " k0 "
                         << k0);
            // A is [m, k] (or stored [k, m]); B is [k, n].
            const int64_t lda = trans_a ? m + 2 : k + 1, ldc = n + 3;
            std::vector<float> a((trans_a ? k : m) * lda), b(k * n);
            for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37f * i);
            for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.11f * i);
            const int64_t panels = packed_gemm::PanelCount(n);
            auto packed = [&](int64_t p0, int64_t rows) {
              std::vector<float> out(packed_gemm::PackedSize(rows, n));
              packed_gemm::Pack(false, rows, n, b.data() + p0 * n, n, 0, panels,
                                out.data());
              return out;
            };
            auto a_at = [&](int64_t p0) {
              return trans_a ? a.data() + p0 * lda : a.data() + p0;
            };
            const std::vector<float> whole = packed(0, k),
                                     first = packed(0, k0),
                                     rest = packed(k0, k - k0);
            std::vector<float> want(m * ldc, 0.0f), got(m * ldc, 0.0f);
            packed_gemm::MultiplyWith(isa, m, k, n, a_at(0), lda, trans_a,
                                      whole.data(), 0, panels, want.data(), ldc,
                                      Sum::kWrite);
            packed_gemm::MultiplyWith(isa, m, k0, n, a_at(0), lda, trans_a,
                                      first.data(), 0, panels, got.data(), ldc,
                                      Sum::kWrite);
            std::vector<float> added = got;
            packed_gemm::MultiplyWith(isa, m, k - k0, n, a_at(k0), lda, trans_a,
                                      rest.data(), 0, panels, got.data(), ldc,
                                      Sum::kResume);
            ASSERT_EQ(got, want);
            packed_gemm::MultiplyWith(isa, m, k - k0, n, a_at(k0), lda, trans_a,
                                      rest.data(), 0, panels, added.data(), ldc,
                                      Sum::kAdd);
            if (added != want) ++differ;
          }
        }
      }
    }
  }
  if (!packed_gemm::IsaSupported(Isa::kAvx2)) {
    GTEST_SKIP() << "this CPU has no AVX2/FMA";
  }
  EXPECT_GT(differ, 0);
}

// The backend resumes the sums of weight-gradient shaped products
// (op(A) = A^T, both sides at least 256) whose depth fits one block, on a
// CPU with AVX-512, and then gives one product's bits; it refuses the
// rest rather than give other bits.
TEST(CpuBackendPackedGemmTest, GemmResumeGivesOneGemmsBitsWhereItSaysItCan) {
  std::unique_ptr<Backend> backend = CreateCpuBackend(2);
  const bool avx512 = packed_gemm::IsaSupported(packed_gemm::Isa::kAvx512);
  EXPECT_EQ(backend->ResumesSums(true, false, 256, 300, 256), avx512);
  EXPECT_FALSE(backend->ResumesSums(true, false, 256, 300, 257));
  EXPECT_FALSE(backend->ResumesSums(true, false, 255, 300, 256));
  EXPECT_FALSE(backend->ResumesSums(false, false, 256, 300, 256));
  const int64_t m = 256, n = 300, k = 256, k0 = 96;
  std::vector<float> a(k * m), b(k * n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37f * i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.11f * i);
  std::vector<float> c(m * n, 0.0f);
  EXPECT_EQ(backend
                ->GemmResume(false, false, m, n, k, a.data(), m, b.data(), n,
                             c.data(), n)
                .code(),
            absl::StatusCode::kFailedPrecondition);
  if (!avx512) GTEST_SKIP() << "this CPU lacks AVX-512: no sums resumed";
  // dW = x^T dy over k rows, as a linear layer's weight gradient.
  std::vector<float> want(m * n), got(m * n);
  ASSERT_TRUE(backend
                  ->Gemm(true, false, m, n, k, 1.0f, a.data(), m, b.data(), n,
                         0.0f, want.data(), n)
                  .ok());
  ASSERT_TRUE(backend
                  ->Gemm(true, false, m, n, k0, 1.0f, a.data(), m, b.data(), n,
                         0.0f, got.data(), n)
                  .ok());
  ASSERT_TRUE(backend
                  ->GemmResume(true, false, m, n, k - k0, a.data() + k0 * m, m,
                               b.data() + k0 * n, n, got.data(), n)
                  .ok());
  EXPECT_EQ(got, want);
  // And it is the product: one element against a double-precision sum.
  double sum = 0;
  for (int64_t p = 0; p < k; ++p) {
    sum += static_cast<double>(a[p * m + m - 1]) * b[p * n + n - 1];
  }
  EXPECT_NEAR(got[m * n - 1], sum, 1e-4 * (1 + std::sqrt(double(k))));
}

TEST(CpuBackendPackedGemmTest, AnOperandNotPackedHereIsRefused) {
  std::unique_ptr<Backend> backend = CreateCpuBackend(1);
  PackedOperand wrong;
  wrong.k = 4;
  wrong.n = 4;  // and no data
  std::vector<float> a(16), c(16);
  EXPECT_EQ(backend->GemmPacked(4, a.data(), 4, wrong, c.data(), 4).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace pipetrain
