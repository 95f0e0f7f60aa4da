#include "common/heap_tuning.h"

#include <sys/resource.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

long ThreadMinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_minflt;
}

// What gRPC does with a large message's receive slices: many blocks of
// about 1 MiB, live together, then freed together. Returns each pass's
// page faults on the calling thread.
std::vector<long> AllocateTouchAndFreeTogether(int passes) {
  constexpr int kBlocks = 16;
  std::vector<long> faults;
  for (int pass = 0; pass < passes; ++pass) {
    const long before = ThreadMinorFaults();
    std::vector<char*> blocks;
    for (int i = 0; i < kBlocks; ++i) {
      const size_t bytes = (size_t{1} << 20) + (i % 3) * 7 * 4096;
      char* p = static_cast<char*>(std::malloc(bytes));
      std::memset(p, 1, bytes);
      blocks.push_back(p);
    }
    for (char* p : blocks) std::free(p);
    faults.push_back(ThreadMinorFaults() - before);
  }
  return faults;
}

TEST(HeapTuningTest, FreedBlocksAreReusedWithoutFreshPages) {
  const HeapTuning tuning = KeepFreedHeapMemory();
  if (tuning == HeapTuning::kUnsupported) {
    GTEST_SKIP() << "not glibc's allocator (a sanitizer build)";
  }
  if (tuning == HeapTuning::kLeftToEnvironment) {
    GTEST_SKIP() << "the environment sets the heap thresholds";
  }
  // On a thread of its own, as gRPC's readers are (a heap of their own).
  std::vector<long> faults;
  std::thread reader([&] { faults = AllocateTouchAndFreeTogether(4); });
  reader.join();
  const long pages_a_pass = 16 * 256;
  // The first passes grow the heap; after them the same blocks come back
  // already mapped. glibc's defaults fault on every page of every pass.
  EXPECT_GE(faults[0], pages_a_pass / 2);
  EXPECT_LT(faults[2], pages_a_pass / 20) << "pass 3 took fresh pages";
  EXPECT_LT(faults[3], pages_a_pass / 20) << "pass 4 took fresh pages";
}

TEST(HeapTuningTest, AnOperatorsThresholdsAreLeftAlone) {
  auto env = [](std::map<std::string, std::string> vars) {
    return [vars](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  };
  EXPECT_FALSE(HeapThresholdsSetByEnvironment(env({})));
  EXPECT_TRUE(HeapThresholdsSetByEnvironment(
      env({{"MALLOC_TRIM_THRESHOLD_", "1048576"}})));
  EXPECT_TRUE(HeapThresholdsSetByEnvironment(
      env({{"MALLOC_MMAP_THRESHOLD_", "1048576"}})));
  EXPECT_TRUE(HeapThresholdsSetByEnvironment(
      env({{"GLIBC_TUNABLES",
            "glibc.malloc.arena_max=2:"
            "glibc.malloc.trim_threshold=4096"}})));
  EXPECT_TRUE(HeapThresholdsSetByEnvironment(
      env({{"GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=4096"}})));
  EXPECT_FALSE(HeapThresholdsSetByEnvironment(
      env({{"GLIBC_TUNABLES", "glibc.malloc.arena_max=2"}})));
}

}  // namespace
}  // namespace pipetrain
