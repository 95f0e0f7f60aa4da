// CUDA backend vs the CPU reference: memory, dense algebra, element-wise
// ops and reductions (row-wise, layout and optimizer ops are in
// compute_cuda_parity_rowwise_test.cc). Tolerances: cuda_parity_fixture.h.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/compute/cuda/cuda_backend.h"
#include "worker/compute/cuda/cuda_block_cache.h"
#include "worker/compute/cuda/cuda_parity_fixture.h"
#include "worker/compute/cuda/cuda_status.h"

namespace pipetrain {
namespace parity {
namespace {

// Runs everywhere: without a device, or without a driver, counting neither
// crashes nor aborts; a runtime that cannot start says which call failed,
// and asking for a missing device is a clean FailedPrecondition.
TEST(CudaBackendNoDevice, CountIsSafeAndMissingDevicesFailCleanly) {
  const absl::StatusOr<int> count = CudaDeviceCount();
  if (count.ok()) {
    EXPECT_GE(*count, 0);
  } else {
    EXPECT_NE(count.status().message().find("cudaGetDeviceCount"),
              std::string::npos)
        << count.status();
  }
  for (int device : {99, -1, count.ok() ? *count : 0}) {
    absl::StatusOr<std::unique_ptr<Backend>> backend =
        CreateCudaBackend(device);
    ASSERT_FALSE(backend.ok()) << "device " << device;
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition)
        << backend.status();
  }
}

absl::Status FailingCudaCall(cudaError_t err) {
  RETURN_IF_CUDA_ERR(err);
  return absl::OkStatus();
}

absl::Status FailingCublasCall(cublasStatus_t status) {
  RETURN_IF_CUBLAS_ERR(status);
  return absl::OkStatus();
}

// Runs everywhere: the error strings come from the runtime library alone.
TEST(CudaStatus, MacrosNameTheCallAndPickCodesByRemedy) {
  EXPECT_TRUE(FailingCudaCall(cudaSuccess).ok());
  EXPECT_TRUE(FailingCublasCall(CUBLAS_STATUS_SUCCESS).ok());
  const absl::Status oom = FailingCudaCall(cudaErrorMemoryAllocation);
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  // The macro's argument text, then where it was.
  EXPECT_EQ(oom.message().rfind("err failed at ", 0), 0u) << oom;
  EXPECT_NE(oom.message().find("compute_cuda_parity_test.cc:"),
            std::string::npos)
      << oom;
  EXPECT_NE(oom.message().find("cudaErrorMemoryAllocation"), std::string::npos)
      << oom;
  EXPECT_EQ(FailingCudaCall(cudaErrorNoDevice).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(FailingCudaCall(cudaErrorInsufficientDriver).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(FailingCudaCall(cudaErrorIllegalAddress).code(),
            absl::StatusCode::kInternal);
  const absl::Status cublas = FailingCublasCall(CUBLAS_STATUS_ALLOC_FAILED);
  EXPECT_EQ(cublas.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(cublas.message().find("CUBLAS_STATUS_ALLOC_FAILED"),
            std::string::npos)
      << cublas;
  EXPECT_EQ(FailingCublasCall(CUBLAS_STATUS_EXECUTION_FAILED).code(),
            absl::StatusCode::kInternal);
}

// Runs everywhere: size classes are pure arithmetic.
TEST(CudaBlockCache, SizeClassesWasteAtMostAQuarter) {
  EXPECT_EQ(CudaBlockCache::RoundUp(1), 512u);
  EXPECT_EQ(CudaBlockCache::RoundUp(512), 512u);
  EXPECT_EQ(CudaBlockCache::RoundUp(513), 640u);
  EXPECT_EQ(CudaBlockCache::RoundUp(1 << 20), size_t{1} << 20);
  for (size_t bytes : {size_t{700}, size_t{4099 * 4}, size_t{123456789}}) {
    const size_t size = CudaBlockCache::RoundUp(bytes);
    EXPECT_GE(size, bytes);
    EXPECT_LE(size, bytes + bytes / 4) << bytes;
    EXPECT_EQ(CudaBlockCache::RoundUp(size), size) << bytes;
  }
}

TEST_F(CudaParityTest, DescribesItsDevice) {
  EXPECT_EQ(gpu_->device(), Device::kCuda);
  EXPECT_EQ(gpu_->Describe().rfind("cuda:0 (", 0), 0u) << gpu_->Describe();
}

TEST_F(CudaParityTest, AllocateZeroesEvenReusedBlocks) {
  for (int round = 0; round < 3; ++round) {
    PT_ASSERT_OK_AND_ASSIGN(Tensor t, gpu_->Allocate({37, 33}));
    EXPECT_EQ(t.device(), Device::kCuda);
    PT_ASSERT_OK_AND_ASSIGN(Tensor host, ToHost(gpu_.get(), t));
    for (float v : host.ToVector()) ASSERT_EQ(v, 0.0f) << "round " << round;
    // Dirty the block; the next round's Allocate likely gets it back.
    PT_ASSERT_OK(gpu_->Fill(t.f32(), t.numel(), 7.0f));
  }
  PT_ASSERT_OK_AND_ASSIGN(Tensor raw, gpu_->AllocateUninitialized({5, 1031}));
  EXPECT_EQ(raw.numel(), 5 * 1031);
  PT_ASSERT_OK_AND_ASSIGN(Tensor empty, gpu_->Allocate({0, 4}));
  EXPECT_EQ(empty.numel(), 0);
  PT_ASSERT_OK(gpu_->Synchronize());
}

TEST_F(CudaParityTest, TensorsMayOutliveTheirBackend) {
  PT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Backend> other, CreateCudaBackend(0));
  PT_ASSERT_OK_AND_ASSIGN(Tensor t, other->Allocate({1000}));
  PT_ASSERT_OK(other->Fill(t.f32(), t.numel(), 1.0f));
  other.reset();  // The tensor's block goes back to a cache it co-owns.
  t = Tensor();
  SUCCEED();
}

TEST_F(CudaParityTest, CopiesRoundTripExactly) {
  const std::vector<float> values = RandomVector(4099, 1);
  PT_ASSERT_OK_AND_ASSIGN(Twin src, Upload(values));
  PT_ASSERT_OK_AND_ASSIGN(Twin dst, Upload(std::vector<float>(4099, 0.0f)));
  ASSERT_TRUE(RunBoth([&](Backend* b) {
    RETURN_IF_ERROR(b->Copy(src.on(b) + 3, 4000, dst.on(b) + 5));
    return b->Copy(src.on(b), 0, dst.on(b));  // n == 0 is a no-op.
  }));
  EXPECT_TRUE(Matches(dst, kExact));
  std::vector<float> back(4099, -1.0f);
  PT_ASSERT_OK(gpu_->CopyToHost(src.gpu.f32(), 4099, back.data()));
  EXPECT_EQ(back, values);
}

struct GemmShape {
  int64_t m, n, k;
};
const GemmShape kGemmShapes[] = {{1, 1, 1},     {37, 53, 29},
                                 {64, 1, 1031}, {129, 257, 65},
                                 {1, 1000, 37}, {257, 129, 1500}};

TEST_F(CudaParityTest, GemmMatchesForEveryTransposeAndShape) {
  uint64_t seed = 10;
  for (const GemmShape& s : kGemmShapes) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (float beta : {0.0f, 0.5f}) {
          // Stored A is [m,k] or [k,m]; leading dims padded by 3.
          const int64_t lda = (ta ? s.m : s.k) + 3;
          const int64_t ldb = (tb ? s.k : s.n) + 3;
          const int64_t ldc = s.n + 3;
          PT_ASSERT_OK_AND_ASSIGN(
              Twin a, Upload(RandomVector((ta ? s.k : s.m) * lda, ++seed)));
          PT_ASSERT_OK_AND_ASSIGN(
              Twin b, Upload(RandomVector((tb ? s.n : s.k) * ldb, ++seed)));
          PT_ASSERT_OK_AND_ASSIGN(Twin c,
                                  Upload(RandomVector(s.m * ldc, ++seed)));
          ASSERT_TRUE(RunBoth([&](Backend* bk) {
            return bk->Gemm(ta, tb, s.m, s.n, s.k, 0.75f, a.on(bk), lda,
                            b.on(bk), ldb, beta, c.on(bk), ldc);
          }));
          EXPECT_TRUE(Matches(c, ReductionTolerance(s.k)))
              << "m " << s.m << " n " << s.n << " k " << s.k << " ta " << ta
              << " tb " << tb << " beta " << beta;
        }
      }
    }
  }
}

TEST_F(CudaParityTest, GemmStridedBatchedMatchesForEveryTranspose) {
  const int64_t batch = 3;
  uint64_t seed = 100;
  for (const GemmShape& s : kGemmShapes) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const int64_t lda = ta ? s.m : s.k;
        const int64_t ldb = tb ? s.k : s.n;
        const int64_t ldc = s.n;
        // Strides leave a gap of 7 floats between matrices.
        const int64_t stride_a = s.m * s.k + 7;
        const int64_t stride_b = s.k * s.n + 7;
        const int64_t stride_c = s.m * s.n + 7;
        PT_ASSERT_OK_AND_ASSIGN(Twin a,
                                Upload(RandomVector(batch * stride_a, ++seed)));
        PT_ASSERT_OK_AND_ASSIGN(Twin b,
                                Upload(RandomVector(batch * stride_b, ++seed)));
        PT_ASSERT_OK_AND_ASSIGN(Twin c,
                                Upload(RandomVector(batch * stride_c, ++seed)));
        ASSERT_TRUE(RunBoth([&](Backend* bk) {
          return bk->GemmStridedBatched(ta, tb, s.m, s.n, s.k, 1.25f, a.on(bk),
                                        lda, stride_a, b.on(bk), ldb, stride_b,
                                        0.5f, c.on(bk), ldc, stride_c, batch);
        }));
        EXPECT_TRUE(Matches(c, ReductionTolerance(s.k)))
            << "m " << s.m << " n " << s.n << " k " << s.k << " ta " << ta
            << " tb " << tb;
      }
    }
  }
}

// Sizes that are 1, odd, not multiples of 32, and larger than one grid pass.
const int64_t kSizes[] = {1, 37, 1000, 4099, 3'000'017};

TEST_F(CudaParityTest, FillAxpbyAddMatch) {
  for (int64_t n : kSizes) {
    PT_ASSERT_OK_AND_ASSIGN(Twin x, Upload(RandomVector(n, 1)));
    PT_ASSERT_OK_AND_ASSIGN(Twin y, Upload(RandomVector(n, 2)));
    PT_ASSERT_OK_AND_ASSIGN(Twin f, Upload(RandomVector(n, 3)));
    ASSERT_TRUE(RunBoth([&](Backend* b) {
      RETURN_IF_ERROR(b->Fill(f.on(b), n, -2.5f));
      RETURN_IF_ERROR(b->Axpby(n, 0.3f, x.on(b), -1.7f, y.on(b)));
      // out aliases a.
      return b->Add(n, x.on(b), y.on(b), x.on(b));
    }));
    EXPECT_TRUE(Matches(f, kExact)) << n;
    EXPECT_TRUE(Matches(y, kElementwise)) << n;
    EXPECT_TRUE(Matches(x, kElementwise)) << n;
  }
}

TEST_F(CudaParityTest, AddRowBroadcastMatches) {
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{1, 1}, {37, 33}, {1000, 3}, {3, 4099}}) {
    PT_ASSERT_OK_AND_ASSIGN(Twin x, Upload(RandomVector(rows * cols, 4)));
    PT_ASSERT_OK_AND_ASSIGN(Twin bias, Upload(RandomVector(cols, 5)));
    ASSERT_TRUE(RunBoth([&](Backend* b) {
      return b->AddRowBroadcast(rows, cols, bias.on(b), x.on(b));
    }));
    EXPECT_TRUE(Matches(x, kExact)) << rows << "x" << cols;
  }
}

TEST_F(CudaParityTest, ReluAndGeluMatch) {
  for (int64_t n : kSizes) {
    PT_ASSERT_OK_AND_ASSIGN(Twin x, Upload(RandomVector(n, 6, -4.0f, 4.0f)));
    PT_ASSERT_OK_AND_ASSIGN(Twin dy, Upload(RandomVector(n, 7)));
    PT_ASSERT_OK_AND_ASSIGN(Twin relu, Upload(std::vector<float>(n)));
    PT_ASSERT_OK_AND_ASSIGN(Twin relu_dx, Upload(RandomVector(n, 8)));
    PT_ASSERT_OK_AND_ASSIGN(Twin gelu, Upload(std::vector<float>(n)));
    PT_ASSERT_OK_AND_ASSIGN(Twin gelu_dx, Upload(std::vector<float>(n)));
    ASSERT_TRUE(RunBoth([&](Backend* b) {
      RETURN_IF_ERROR(b->ReluForward(n, x.on(b), relu.on(b)));
      // dx aliases dy.
      RETURN_IF_ERROR(
          b->ReluBackward(n, relu.on(b), relu_dx.on(b), relu_dx.on(b)));
      RETURN_IF_ERROR(b->GeluForward(n, x.on(b), gelu.on(b)));
      return b->GeluBackward(n, x.on(b), dy.on(b), gelu_dx.on(b));
    }));
    EXPECT_TRUE(Matches(relu, kExact)) << n;
    EXPECT_TRUE(Matches(relu_dx, kExact)) << n;
    EXPECT_TRUE(Matches(gelu, kElementwise)) << n;
    EXPECT_TRUE(Matches(gelu_dx, kElementwise)) << n;
  }
}

TEST_F(CudaParityTest, DropoutMasksAreIdentical) {
  for (int64_t n : kSizes) {
    for (float rate : {0.0f, 0.1f, 0.5f}) {
      PT_ASSERT_OK_AND_ASSIGN(Twin x, Upload(RandomVector(n, 9, 0.5f, 1.5f)));
      PT_ASSERT_OK_AND_ASSIGN(Twin y, Upload(std::vector<float>(n)));
      ASSERT_TRUE(RunBoth([&](Backend* b) {
        return b->Dropout(n, x.on(b), rate, 0xfeedull + n, y.on(b));
      }));
      // The same bits from the same (seed, index): every element identical.
      EXPECT_TRUE(Matches(y, kExact)) << n << " rate " << rate;
    }
  }
}

TEST_F(CudaParityTest, ColumnSumMatchesIncludingTallMatrices) {
  // (5000, 3) and (70001, 2) take the two-pass (chunked) path.
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1},
                            {37, 5},
                            {5000, 3},
                            {70001, 2},
                            {1031, 300},
                            {3, 2000},
                            {0, 7}}) {
    for (float beta : {0.0f, 0.5f}) {
      PT_ASSERT_OK_AND_ASSIGN(Twin x, Upload(RandomVector(rows * cols, 11)));
      PT_ASSERT_OK_AND_ASSIGN(Twin out, Upload(RandomVector(cols, 12)));
      ASSERT_TRUE(RunBoth([&](Backend* b) {
        return b->ColumnSum(rows, cols, x.on(b), beta, out.on(b));
      }));
      EXPECT_TRUE(Matches(out, ReductionTolerance(rows)))
          << rows << "x" << cols << " beta " << beta;
    }
  }
}

TEST_F(CudaParityTest, SumSquaresMatches) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{37}, int64_t{4099},
                    int64_t{(1 << 20) + 3}}) {
    PT_ASSERT_OK_AND_ASSIGN(Twin x, Upload(RandomVector(n, 13, -3.0f, 3.0f)));
    PT_ASSERT_OK_AND_ASSIGN(const double want,
                            cpu_->SumSquares(n, x.cpu.f32()));
    PT_ASSERT_OK_AND_ASSIGN(const double got, gpu_->SumSquares(n, x.gpu.f32()));
    EXPECT_NEAR(got, want, 1e-9 * want) << n;  // Both sum in double.
  }
}

TEST_F(CudaParityTest, EmptyOpsAreNoOpsAndNegativeSizesAreRejected) {
  PT_ASSERT_OK(gpu_->Fill(nullptr, 0, 1.0f));
  PT_ASSERT_OK(gpu_->Gemm(false, false, 0, 5, 3, 1.0f, nullptr, 3, nullptr, 5,
                          0.0f, nullptr, 5));
  PT_ASSERT_OK(gpu_->SoftmaxForward(0, 5, 0, nullptr, nullptr));
  PT_ASSERT_OK(gpu_->EmbeddingForward(0, 4, 10, nullptr, nullptr, nullptr));
  EXPECT_EQ(gpu_->Fill(nullptr, -1, 1.0f).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->SoftmaxForward(-2, 5, 0, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  PT_ASSERT_OK(gpu_->Synchronize());
}

}  // namespace
}  // namespace parity
}  // namespace pipetrain
