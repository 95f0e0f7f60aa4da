#include "common/heap_tuning.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>

#include "common/sanitizer_build.h"

namespace pipetrain {
namespace {

// AddressSanitizer and ThreadSanitizer bring allocators of their own, on
// which glibc's mallopt has no effect (ASan's refuses it, TSan's accepts
// it and ignores it).
constexpr bool kOwnAllocator = kAddressSanitizerBuild || kThreadSanitizerBuild;

}  // namespace

bool HeapThresholdsSetByEnvironment(
    const std::function<const char*(const char*)>& getenv) {
  for (const char* name :
       {"MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_"}) {
    if (getenv(name) != nullptr) return true;
  }
  const char* tunables = getenv("GLIBC_TUNABLES");
  if (tunables == nullptr) return false;
  return std::strstr(tunables, "glibc.malloc.trim_threshold") != nullptr ||
         std::strstr(tunables, "glibc.malloc.mmap_threshold") != nullptr;
}

HeapTuning KeepFreedHeapMemory() {
  if (HeapThresholdsSetByEnvironment(
          [](const char* name) { return std::getenv(name); })) {
    return HeapTuning::kLeftToEnvironment;
  }
  if (kOwnAllocator) return HeapTuning::kUnsupported;
  // Setting either threshold turns off glibc's adjusting of both.
  if (mallopt(M_MMAP_THRESHOLD, static_cast<int>(kHeapMmapThresholdBytes)) !=
          1 ||
      mallopt(M_TRIM_THRESHOLD, static_cast<int>(kHeapTrimThresholdBytes)) !=
          1) {
    return HeapTuning::kUnsupported;
  }
  return HeapTuning::kApplied;
}

const char* HeapTuningDescription(HeapTuning tuning) {
  switch (tuning) {
    case HeapTuning::kApplied:
      return "heap: blocks under 32 MiB from the heap, up to 256 MiB of freed "
             "memory kept";
    case HeapTuning::kLeftToEnvironment:
      return "heap: thresholds as the environment sets them";
    case HeapTuning::kUnsupported:
      return "heap: the allocator's own thresholds (not glibc's, or mallopt "
             "refused)";
  }
  return "heap: unknown";
}

}  // namespace pipetrain
