// CUDA backend vs the CPU reference: row-wise ops, gathers/scatters, layout
// and optimizer updates. Tolerances: cuda_parity_fixture.h.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "worker/compute/cuda/cuda_parity_fixture.h"

namespace pipetrain {
namespace parity {
namespace {

using RowShape = std::pair<int64_t, int64_t>;  // rows, cols

TEST_F(CudaParityTest, SoftmaxForwardMatchesPlainAndCausal) {
  struct Case {
    int64_t rows, cols, causal_t;
  };
  const Case cases[] = {
      {1, 1, 0},     {5, 33, 0},    {37, 1000, 0},    {3, 4099, 0},
      {70001, 3, 0}, {3 * 8, 8, 8}, {2 * 37, 37, 37}, {4 * 5, 33, 5},  // causal
  };
  for (const Case& c : cases) {
    const int64_t n = c.rows * c.cols;
    PT_ASSERT_OK_AND_ASSIGN(Twin x, Upload(RandomVector(n, 20, -5.0f, 5.0f)));
    PT_ASSERT_OK_AND_ASSIGN(Twin y, Upload(RandomVector(n, 21)));
    ASSERT_TRUE(RunBoth([&](Backend* b) {
      return b->SoftmaxForward(c.rows, c.cols, c.causal_t, x.on(b), y.on(b));
    }));
    EXPECT_TRUE(Matches(y, kRowwise))
        << c.rows << "x" << c.cols << " causal_t " << c.causal_t;
  }
}

TEST_F(CudaParityTest, SoftmaxBackwardMatchesInPlace) {
  for (auto [rows, cols] : {RowShape{1, 1}, RowShape{37, 1000}, RowShape{5, 33},
                            RowShape{2, 4099}}) {
    const int64_t n = rows * cols;
    PT_ASSERT_OK_AND_ASSIGN(Twin x, Upload(RandomVector(n, 22, -3.0f, 3.0f)));
    PT_ASSERT_OK_AND_ASSIGN(Twin y, Upload(std::vector<float>(n)));
    PT_ASSERT_OK_AND_ASSIGN(Twin dy, Upload(RandomVector(n, 23)));
    ASSERT_TRUE(RunBoth([&](Backend* b) {
      RETURN_IF_ERROR(b->SoftmaxForward(rows, cols, 0, x.on(b), y.on(b)));
      return b->SoftmaxBackward(rows, cols, y.on(b), dy.on(b), dy.on(b));
    }));
    EXPECT_TRUE(Matches(dy, kRowwise)) << rows << "x" << cols;
  }
}

TEST_F(CudaParityTest, LayerNormForwardAndBackwardMatch) {
  for (auto [rows, cols] : {RowShape{1, 1}, RowShape{37, 768},
                            RowShape{2000, 37}, RowShape{3, 1025}}) {
    const int64_t n = rows * cols;
    PT_ASSERT_OK_AND_ASSIGN(Twin x, Upload(RandomVector(n, 30, -2.0f, 3.0f)));
    PT_ASSERT_OK_AND_ASSIGN(Twin gamma,
                            Upload(RandomVector(cols, 31, 0.5f, 1.5f)));
    PT_ASSERT_OK_AND_ASSIGN(Twin beta, Upload(RandomVector(cols, 32)));
    PT_ASSERT_OK_AND_ASSIGN(Twin y, Upload(std::vector<float>(n)));
    PT_ASSERT_OK_AND_ASSIGN(Twin mean, Upload(std::vector<float>(rows)));
    PT_ASSERT_OK_AND_ASSIGN(Twin rstd, Upload(std::vector<float>(rows)));
    PT_ASSERT_OK_AND_ASSIGN(Twin dy, Upload(RandomVector(n, 33)));
    PT_ASSERT_OK_AND_ASSIGN(Twin dx, Upload(std::vector<float>(n)));
    // Non-zero starting gradients: the op accumulates into them.
    PT_ASSERT_OK_AND_ASSIGN(Twin dgamma, Upload(RandomVector(cols, 34)));
    PT_ASSERT_OK_AND_ASSIGN(Twin dbeta, Upload(RandomVector(cols, 35)));
    ASSERT_TRUE(RunBoth([&](Backend* b) {
      RETURN_IF_ERROR(b->LayerNormForward(rows, cols, x.on(b), gamma.on(b),
                                          beta.on(b), 1e-5f, y.on(b),
                                          mean.on(b), rstd.on(b)));
      return b->LayerNormBackward(rows, cols, x.on(b), gamma.on(b), mean.on(b),
                                  rstd.on(b), dy.on(b), dx.on(b), dgamma.on(b),
                                  dbeta.on(b));
    }));
    EXPECT_TRUE(Matches(mean, kRowwise)) << rows << "x" << cols;
    EXPECT_TRUE(Matches(rstd, kRowwise)) << rows << "x" << cols;
    EXPECT_TRUE(Matches(y, kRowwise)) << rows << "x" << cols;
    EXPECT_TRUE(Matches(dx, kRowwise)) << rows << "x" << cols;
    EXPECT_TRUE(Matches(dgamma, ReductionTolerance(rows)))
        << rows << "x" << cols;
    EXPECT_TRUE(Matches(dbeta, ReductionTolerance(rows)))
        << rows << "x" << cols;
  }
}

TEST_F(CudaParityTest, SoftmaxCrossEntropyMatches) {
  for (auto [rows, cols] : {RowShape{1, 1}, RowShape{37, 1000},
                            RowShape{4096, 10}, RowShape{3, 4099}}) {
    const int64_t n = rows * cols;
    PT_ASSERT_OK_AND_ASSIGN(Twin logits,
                            Upload(RandomVector(n, 40, -4.0f, 4.0f)));
    PT_ASSERT_OK_AND_ASSIGN(Twin labels, Upload(RandomIds(rows, cols, 41)));
    PT_ASSERT_OK_AND_ASSIGN(Twin probs, Upload(std::vector<float>(n)));
    PT_ASSERT_OK_AND_ASSIGN(Twin loss, Upload(std::vector<float>(rows)));
    PT_ASSERT_OK_AND_ASSIGN(Twin correct, Upload(std::vector<float>(rows)));
    PT_ASSERT_OK_AND_ASSIGN(Twin dlogits, Upload(std::vector<float>(n)));
    ASSERT_TRUE(RunBoth([&](Backend* b) {
      RETURN_IF_ERROR(b->SoftmaxCrossEntropy(rows, cols, logits.on(b),
                                             labels.on(b), probs.on(b),
                                             loss.on(b), correct.on(b)));
      return b->SoftmaxCrossEntropyBackward(rows, cols, probs.on(b),
                                            labels.on(b), 0.25f, dlogits.on(b));
    }));
    EXPECT_TRUE(Matches(probs, kRowwise)) << rows << "x" << cols;
    EXPECT_TRUE(Matches(loss, kRowwise)) << rows << "x" << cols;
    EXPECT_TRUE(Matches(correct, kExact)) << rows << "x" << cols;
    EXPECT_TRUE(Matches(dlogits, kRowwise)) << rows << "x" << cols;
  }
}

TEST_F(CudaParityTest, SoftmaxCrossEntropyRejectsBadLabels) {
  const int64_t rows = 4, cols = 10;
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  for (float bad : {-1.0f, 10.0f, 2.5f, kNaN}) {
    PT_ASSERT_OK_AND_ASSIGN(Twin logits, Upload(RandomVector(rows * cols, 42)));
    PT_ASSERT_OK_AND_ASSIGN(Twin labels, Upload({1.0f, 9.0f, bad, 0.0f}));
    PT_ASSERT_OK_AND_ASSIGN(Twin probs,
                            Upload(std::vector<float>(rows * cols)));
    PT_ASSERT_OK_AND_ASSIGN(Twin loss, Upload(std::vector<float>(rows)));
    PT_ASSERT_OK_AND_ASSIGN(Twin correct, Upload(std::vector<float>(rows)));
    for (Backend* b : {cpu_.get(), gpu_.get()}) {
      const absl::Status status =
          b->SoftmaxCrossEntropy(rows, cols, logits.on(b), labels.on(b),
                                 probs.on(b), loss.on(b), correct.on(b));
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
          << b->Describe() << " label " << bad << ": " << status;
    }
    // The error is an ordinary return: the device stays usable.
    PT_ASSERT_OK(gpu_->Fill(probs.gpu.f32(), rows * cols, 1.0f));
    PT_ASSERT_OK(gpu_->Synchronize());
  }
}

TEST_F(CudaParityTest, EmbeddingForwardMatchesAndRejectsBadIds) {
  for (auto [n, dim] :
       {RowShape{1, 1}, RowShape{129, 37}, RowShape{1000, 64}}) {
    const int64_t vocab = 1031;
    PT_ASSERT_OK_AND_ASSIGN(Twin ids, Upload(RandomIds(n, vocab, 50)));
    PT_ASSERT_OK_AND_ASSIGN(Twin table, Upload(RandomVector(vocab * dim, 51)));
    PT_ASSERT_OK_AND_ASSIGN(Twin out, Upload(RandomVector(n * dim, 52)));
    ASSERT_TRUE(RunBoth([&](Backend* b) {
      return b->EmbeddingForward(n, dim, vocab, ids.on(b), table.on(b),
                                 out.on(b));
    }));
    EXPECT_TRUE(Matches(out, kExact)) << n << "x" << dim;
  }
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  for (float bad : {-1.0f, 7.0f, 0.5f, kNaN}) {
    PT_ASSERT_OK_AND_ASSIGN(Twin ids, Upload({0.0f, 6.0f, bad}));
    PT_ASSERT_OK_AND_ASSIGN(Twin table, Upload(RandomVector(7 * 4, 53)));
    PT_ASSERT_OK_AND_ASSIGN(Twin out, Upload(std::vector<float>(3 * 4)));
    for (Backend* b : {cpu_.get(), gpu_.get()}) {
      const absl::Status status =
          b->EmbeddingForward(3, 4, 7, ids.on(b), table.on(b), out.on(b));
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
          << b->Describe() << " id " << bad << ": " << status;
    }
    PT_ASSERT_OK(gpu_->Synchronize());
  }
}

TEST_F(CudaParityTest, EmbeddingBackwardAccumulatesRepeatedIds) {
  for (auto [n, dim] :
       {RowShape{1, 1}, RowShape{129, 37}, RowShape{4096, 33}}) {
    const int64_t vocab = 7;  // Few ids: many rows meet in the same entry.
    PT_ASSERT_OK_AND_ASSIGN(Twin ids, Upload(RandomIds(n, vocab, 54)));
    PT_ASSERT_OK_AND_ASSIGN(Twin dy, Upload(RandomVector(n * dim, 55)));
    PT_ASSERT_OK_AND_ASSIGN(Twin dtable, Upload(RandomVector(vocab * dim, 56)));
    ASSERT_TRUE(RunBoth([&](Backend* b) {
      return b->EmbeddingBackward(n, dim, ids.on(b), dy.on(b), dtable.on(b));
    }));
    EXPECT_TRUE(Matches(dtable, ReductionTolerance(n / vocab)))
        << n << "x" << dim;
  }
}

TEST_F(CudaParityTest, PermuteMatchesForAllPermutations) {
  for (const std::array<int64_t, 4>& dims :
       {std::array<int64_t, 4>{2, 37, 5, 33}, {3, 1, 4, 1}, {1, 1, 1, 1}}) {
    const int64_t n = dims[0] * dims[1] * dims[2] * dims[3];
    PT_ASSERT_OK_AND_ASSIGN(Twin in, Upload(RandomVector(n, 60)));
    std::array<int, 4> perm = {0, 1, 2, 3};
    do {
      Permute4 p;
      for (int k = 0; k < 4; ++k) {
        p.dims[k] = dims[k];
        p.perm[k] = perm[k];
      }
      PT_ASSERT_OK_AND_ASSIGN(Twin out, Upload(std::vector<float>(n)));
      ASSERT_TRUE(RunBoth(
          [&](Backend* b) { return b->Permute(p, in.on(b), out.on(b)); }));
      EXPECT_TRUE(Matches(out, kExact))
          << "perm " << perm[0] << perm[1] << perm[2] << perm[3];
    } while (std::next_permutation(perm.begin(), perm.end()));
  }
}

TEST_F(CudaParityTest, SgdUpdateMatchesWithAndWithoutMomentum) {
  for (int64_t n : {int64_t{1}, int64_t{37}, int64_t{100'003}}) {
    for (float momentum : {0.0f, 0.9f}) {
      PT_ASSERT_OK_AND_ASSIGN(Twin w, Upload(RandomVector(n, 70)));
      PT_ASSERT_OK_AND_ASSIGN(Twin m, Upload(RandomVector(n, 71)));
      for (int step = 0; step < 3; ++step) {
        PT_ASSERT_OK_AND_ASSIGN(Twin g, Upload(RandomVector(n, 72 + step)));
        ASSERT_TRUE(RunBoth([&](Backend* b) {
          return b->SgdUpdate(n, w.on(b), g.on(b), m.on(b), 0.1f, momentum,
                              0.01f, 0.5f);
        }));
      }
      EXPECT_TRUE(Matches(w, kElementwise)) << n << " momentum " << momentum;
      // With momentum 0, m is untouched on both.
      EXPECT_TRUE(Matches(m, kElementwise)) << n << " momentum " << momentum;
    }
  }
}

TEST_F(CudaParityTest, AdamWUpdateMatches) {
  for (int64_t n : {int64_t{1}, int64_t{37}, int64_t{100'003}}) {
    PT_ASSERT_OK_AND_ASSIGN(Twin w, Upload(RandomVector(n, 80)));
    PT_ASSERT_OK_AND_ASSIGN(Twin m, Upload(std::vector<float>(n)));
    PT_ASSERT_OK_AND_ASSIGN(Twin v, Upload(std::vector<float>(n)));
    const float beta1 = 0.9f, beta2 = 0.999f;
    for (int t = 1; t <= 3; ++t) {
      PT_ASSERT_OK_AND_ASSIGN(Twin g, Upload(RandomVector(n, 81 + t)));
      const float bias1 = 1.0f - std::pow(beta1, static_cast<float>(t));
      const float bias2 = 1.0f - std::pow(beta2, static_cast<float>(t));
      ASSERT_TRUE(RunBoth([&](Backend* b) {
        return b->AdamWUpdate(n, w.on(b), g.on(b), m.on(b), v.on(b), 1e-3f,
                              beta1, beta2, 1e-8f, 0.01f, bias1, bias2, 1.0f);
      }));
    }
    EXPECT_TRUE(Matches(w, kElementwise)) << n;
    EXPECT_TRUE(Matches(m, kElementwise)) << n;
    EXPECT_TRUE(Matches(v, kElementwise)) << n;
  }
}

}  // namespace
}  // namespace parity
}  // namespace pipetrain
