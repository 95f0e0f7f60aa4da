// The rule that lets a `gpu` test skip: only where no GPU is visible. Runs
// on every machine (it feeds the rule made-up nvidia-smi output and CUDA
// answers), so the fail path is checked where no GPU exists too.
#include "worker/compute/gpu_test_gate.h"

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace pipetrain::gpu_test {
namespace {

constexpr char kOneGpu[] =
    "GPU 0: NVIDIA H100 80GB HBM3 (UUID: "
    "GPU-5a0b6c4e-0000-0000-0000-000000000000)\n";

TEST(GpuTestGate, CountsTheGpusNvidiaSmiLists) {
  EXPECT_EQ(CountListedGpus(""), 0);
  EXPECT_EQ(CountListedGpus("sh: 1: nvidia-smi: not found\n"), 0);
  EXPECT_EQ(CountListedGpus("No devices were found\n"), 0);
  EXPECT_EQ(CountListedGpus(
                "NVIDIA-SMI has failed because it couldn't communicate with "
                "the NVIDIA driver.\n"),
            0);
  EXPECT_EQ(CountListedGpus(kOneGpu), 1);
  EXPECT_EQ(CountListedGpus(std::string(kOneGpu) +
                            "  MIG 1g.10gb Device 0: (UUID: MIG-1)\n"
                            "GPU 1: NVIDIA H100 (UUID: GPU-2)\n"),
            2);
}

TEST(GpuTestGate, SkipsOnlyWhereNoGpuIsVisible) {
  const Decision absent = Decide("sh: 1: nvidia-smi: not found\n",
                                 absl::FailedPreconditionError("no driver"));
  EXPECT_EQ(absent.verdict, Verdict::kSkip);
  EXPECT_NE(absent.reason.find("nvidia-smi: not found"), std::string::npos)
      << absent.reason;
  EXPECT_EQ(Decide("No devices were found\n", 0).verdict, Verdict::kSkip);
}

TEST(GpuTestGate, AVisibleGpuThatCudaCannotUseFailsWithTheCudaError) {
  const absl::Status driver = absl::FailedPreconditionError(
      "cudaGetDeviceCount(&count) failed at cuda_backend.cc:240: "
      "cudaErrorInsufficientDriver (CUDA driver version is insufficient for "
      "CUDA runtime version)");
  const Decision broken = Decide(kOneGpu, driver);
  EXPECT_EQ(broken.verdict, Verdict::kFail);
  EXPECT_NE(broken.reason.find("cudaErrorInsufficientDriver (CUDA driver "
                               "version is insufficient"),
            std::string::npos)
      << broken.reason;
  EXPECT_NE(broken.reason.find("lists 1 GPU"), std::string::npos)
      << broken.reason;

  const Decision no_backend = Decide(
      kOneGpu, absl::FailedPreconditionError("this build has no CUDA backend"));
  EXPECT_EQ(no_backend.verdict, Verdict::kFail);
  EXPECT_NE(no_backend.reason.find("no CUDA backend"), std::string::npos);

  const Decision hidden = Decide(kOneGpu, 0);
  EXPECT_EQ(hidden.verdict, Verdict::kFail);
  EXPECT_NE(hidden.reason.find("CUDA_VISIBLE_DEVICES"), std::string::npos);
}

TEST(GpuTestGate, RunsWhereAVisibleGpuWorks) {
  EXPECT_EQ(Decide(kOneGpu, 1).verdict, Verdict::kRun);
}

}  // namespace
}  // namespace pipetrain::gpu_test
