#include "worker/compute/cpu/blas_kernels.h"

#include <string>

#include "gtest/gtest.h"
#include "worker/compute/cpu/packed_gemm.h"

namespace pipetrain {
namespace {

TEST(BlasKernels, TheDescriptionNamesTheKernelsThatRun) {
  ASSERT_FALSE(BlasCoreName().empty());
  EXPECT_EQ(DescribeCpuKernels(false),
            "openblas " + BlasCoreName() + ", packed off");
  const std::string expected_kernel =
      packed_gemm::BestIsa() == packed_gemm::Isa::kAvx512 ? "avx512" : "avx2";
  EXPECT_EQ(DescribeCpuKernels(true),
            "openblas " + BlasCoreName() + ", packed " + expected_kernel);
}

}  // namespace
}  // namespace pipetrain
