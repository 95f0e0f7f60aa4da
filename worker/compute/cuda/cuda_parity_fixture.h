// Test fixture for the CUDA-vs-CPU parity tests: one CPU backend (the
// reference) and one CUDA backend, data uploaded to both, the same op run on
// both, results compared element by element.
//
// Tolerances: |gpu - cpu| <= atol + rtol * |cpu|.
//   kExact        copies, gathers, permutations, masks: identical bits.
//   kElementwise  the same per-element formula (elementwise_math.h); only
//                 FMA contraction and 1-2 ulp libm differences remain.
//   kRowwise      short float sums in a different order (softmax, layer
//                 norm): rtol 1e-4, atol 1e-5.
//   ReductionTolerance(k)  sums of k terms of O(1) values (Gemm, column
//                 sums): rtol 1e-4 and atol 1e-5 * sqrt(k), i.e. 1e-5 of
//                 the typical size of such a sum.
// Every test skips where no GPU is visible and fails where one is visible
// but CUDA cannot use it (gpu_test_gate.h).
#ifndef PIPETRAIN_WORKER_COMPUTE_CUDA_CUDA_PARITY_FIXTURE_H_
#define PIPETRAIN_WORKER_COMPUTE_CUDA_CUDA_PARITY_FIXTURE_H_

#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "worker/compute/backend.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/compute/cuda/cuda_backend.h"
#include "worker/compute/elementwise_math.h"
#include "worker/compute/gpu_test_gate.h"

namespace pipetrain {
namespace parity {

#define PT_ASSERT_OK(expr)                                    \
  do {                                                        \
    const ::absl::Status pt_assert_status_ = (expr);          \
    ASSERT_TRUE(pt_assert_status_.ok()) << pt_assert_status_; \
  } while (0)

#define PT_ASSERT_OK_AND_ASSIGN(lhs, rexpr)                                 \
  PT_ASSERT_OK_AND_ASSIGN_IMPL_(PT_STATUS_CONCAT_(pt_assert_or_, __LINE__), \
                                lhs, rexpr)
#define PT_ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                  \
  ASSERT_TRUE(statusor.ok()) << statusor.status();          \
  lhs = std::move(statusor).value()

struct Tolerance {
  double rtol;
  double atol;
};
constexpr Tolerance kExact{0.0, 0.0};
constexpr Tolerance kElementwise{1e-5, 1e-6};
constexpr Tolerance kRowwise{1e-4, 1e-5};
inline Tolerance ReductionTolerance(int64_t k) {
  return {1e-4, 1e-5 * std::sqrt(static_cast<double>(k > 1 ? k : 1))};
}

// n values uniform in [lo, hi), a pure function of (seed, i) on any platform.
inline std::vector<float> RandomVector(int64_t n, uint64_t seed,
                                       float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) {
    v[i] = lo + (hi - lo) * math::UniformAt(seed, static_cast<uint64_t>(i));
  }
  return v;
}

// n integers in [0, classes) as floats (labels, token ids).
inline std::vector<float> RandomIds(int64_t n, int64_t classes, uint64_t seed) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) {
    const float u = math::UniformAt(seed, static_cast<uint64_t>(i));
    v[i] = static_cast<float>(static_cast<int64_t>(u * classes) % classes);
  }
  return v;
}

// The same data on the CPU backend and on the CUDA backend.
struct Twin {
  Tensor cpu;
  Tensor gpu;
  float* on(const Backend* b) const {
    return b->device() == Device::kCuda ? gpu.f32() : cpu.f32();
  }
};

class CudaParityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PT_GPU_TEST_REQUIRE_CUDA();
    cpu_ = CreateCpuBackend(1);
    absl::StatusOr<std::unique_ptr<Backend>> gpu = CreateCudaBackend(0);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = std::move(gpu).value();
  }

  // Uploads `values` to both backends.
  absl::StatusOr<Twin> Upload(const std::vector<float>& values) {
    const Tensor host =
        Tensor::HostFrom({static_cast<int64_t>(values.size())}, values);
    Twin twin;
    ASSIGN_OR_RETURN(twin.cpu, ToDevice(cpu_.get(), host));
    ASSIGN_OR_RETURN(twin.gpu, ToDevice(gpu_.get(), host));
    return twin;
  }

  // Runs `op(backend)` on the CPU backend, then on the CUDA backend.
  template <typename Op>
  ::testing::AssertionResult RunBoth(Op op) {
    for (Backend* b : {cpu_.get(), gpu_.get()}) {
      const absl::Status status = op(b);
      if (!status.ok()) {
        return ::testing::AssertionFailure() << b->Describe() << ": " << status;
      }
    }
    return ::testing::AssertionSuccess();
  }

  // Both results of `twin`, CPU first.
  std::pair<std::vector<float>, std::vector<float>> Fetch(const Twin& twin) {
    std::pair<std::vector<float>, std::vector<float>> out;
    absl::StatusOr<Tensor> c = ToHost(cpu_.get(), twin.cpu);
    absl::StatusOr<Tensor> g = ToHost(gpu_.get(), twin.gpu);
    EXPECT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(g.ok()) << g.status();
    if (c.ok()) out.first = c->ToVector();
    if (g.ok()) out.second = g->ToVector();
    return out;
  }

  // Whether the CUDA result of `twin` matches the CPU's within `tol`.
  ::testing::AssertionResult Matches(const Twin& twin, Tolerance tol) {
    const auto [want, got] = Fetch(twin);
    if (want.size() != got.size()) {
      return ::testing::AssertionFailure()
             << "sizes differ: cpu " << want.size() << ", cuda " << got.size();
    }
    int64_t bad = 0;
    double worst = 0.0;
    ::testing::AssertionResult result = ::testing::AssertionFailure();
    for (size_t i = 0; i < want.size(); ++i) {
      const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
      const bool same_nan = std::isnan(want[i]) && std::isnan(got[i]);
      if (same_nan || err <= tol.atol + tol.rtol * std::fabs(want[i])) continue;
      if (!(err <= worst)) worst = err;
      if (bad++ < 5) {
        result << "\n  [" << i << "] cpu " << want[i] << " cuda " << got[i];
      }
    }
    if (bad == 0) return ::testing::AssertionSuccess();
    return result << "\n  " << bad << " of " << want.size()
                  << " elements differ; worst |error| " << worst << " (rtol "
                  << tol.rtol << ", atol " << tol.atol << ")";
  }

  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<Backend> gpu_;
};

}  // namespace parity
}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COMPUTE_CUDA_CUDA_PARITY_FIXTURE_H_
