// The one rule that decides whether a `gpu`-labelled test runs, skips or
// fails (test-only; include it from tests alone).
//
// A GPU test may skip only where no NVIDIA GPU is visible: `nvidia-smi -L`
// lists none, or nvidia-smi is absent. Where one is visible, CUDA must work:
// if the build has no CUDA backend, or the runtime cannot start (a driver
// older than the runtime, a device that fails to initialise, ...), or the
// runtime sees no device (CUDA_VISIBLE_DEVICES hides them all), the test
// FAILS with the reason, so a broken GPU machine cannot pass by skipping.
//
// Use at the top of SetUp() or of a test body:
//   PT_GPU_TEST_REQUIRE_CUDA();
#ifndef PIPETRAIN_WORKER_COMPUTE_GPU_TEST_GATE_H_
#define PIPETRAIN_WORKER_COMPUTE_GPU_TEST_GATE_H_

#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "worker/compute/backend.h"

namespace pipetrain {
namespace gpu_test {

// GPUs named in `nvidia-smi -L` output ("GPU 0: NVIDIA H100 ... (UUID: ...)"
// per line; anything else, such as "No devices were found", names none).
inline int CountListedGpus(const std::string& nvidia_smi_output) {
  int count = 0;
  for (absl::string_view line : absl::StrSplit(nvidia_smi_output, '\n')) {
    line = absl::StripLeadingAsciiWhitespace(line);
    count += absl::StartsWith(line, "GPU ") ? 1 : 0;
  }
  return count;
}

// What `nvidia-smi -L` prints, stderr included; empty when it is absent.
inline std::string RunNvidiaSmi() {
  FILE* pipe = popen("nvidia-smi -L 2>&1", "r");
  if (pipe == nullptr) return "";
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), pipe) != nullptr) out += buf;
  (void)pclose(pipe);
  return out;
}

enum class Verdict { kRun, kSkip, kFail };

struct Decision {
  Verdict verdict;
  std::string reason;  // why it skips or fails
};

// The rule above, from `nvidia-smi -L`'s output and what CUDA reported
// (UsableCudaDevices()).
inline Decision Decide(const std::string& nvidia_smi_output,
                       const absl::StatusOr<int>& usable) {
  const int listed = CountListedGpus(nvidia_smi_output);
  if (listed == 0) {
    return {Verdict::kSkip,
            absl::StrCat("no NVIDIA GPU visible (nvidia-smi -L lists none or "
                         "is absent; it said: \"",
                         absl::StripTrailingAsciiWhitespace(nvidia_smi_output),
                         "\")")};
  }
  const std::string seen =
      absl::StrCat("nvidia-smi -L lists ", listed, " GPU(s), ");
  if (!usable.ok()) {
    return {Verdict::kFail, absl::StrCat(seen, "but CUDA cannot use them: ",
                                         usable.status().ToString())};
  }
  if (*usable == 0) {
    return {Verdict::kFail,
            absl::StrCat(seen,
                         "but the CUDA runtime reports no device "
                         "(cudaErrorNoDevice; is CUDA_VISIBLE_DEVICES set?)")};
  }
  return {Verdict::kRun, ""};
}

// The decision for this machine and this build.
inline Decision DecideHere() {
  return Decide(RunNvidiaSmi(), UsableCudaDevices());
}

}  // namespace gpu_test
}  // namespace pipetrain

// Skips the calling test where no GPU is visible, fails it where one is
// visible but CUDA does not work, and otherwise lets it run.
#define PT_GPU_TEST_REQUIRE_CUDA()                                         \
  do {                                                                     \
    const ::pipetrain::gpu_test::Decision pt_gpu_decision_ =               \
        ::pipetrain::gpu_test::DecideHere();                               \
    if (pt_gpu_decision_.verdict == ::pipetrain::gpu_test::Verdict::kSkip) \
      GTEST_SKIP() << pt_gpu_decision_.reason;                             \
    if (pt_gpu_decision_.verdict == ::pipetrain::gpu_test::Verdict::kFail) \
      FAIL() << pt_gpu_decision_.reason;                                   \
  } while (0)

#endif  // PIPETRAIN_WORKER_COMPUTE_GPU_TEST_GATE_H_
