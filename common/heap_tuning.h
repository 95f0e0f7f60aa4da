// How glibc's allocator gives freed memory back to the system, set for
// processes that stream large messages.
//
// gRPC reads a large message into many receive slices and frees them
// together once the message is decoded. By default glibc then trims the
// freed top of the thread's heap (its trim threshold follows the largest
// block it has unmapped, at most 64 MiB) and hands the pages back with
// madvise(MADV_DONTNEED), so the next message's reads land on fresh pages:
// a page fault per 4 KiB, dear on a virtual machine. Measured with
// bench_transport on loopback, runs that trimmed this way took 0.5-0.9
// million page faults against 0.3 million (mostly the bench's own setup)
// and streamed 1-16 MiB tensors at a fraction of their usual rate.
//
// KeepFreedHeapMemory fixes both thresholds instead: blocks below 32 MiB
// (glibc's largest mmap threshold) come from the heap, and a heap keeps
// up to 256 MiB of freed memory at its top, so a process's memory stays
// at its peak rather than following each message. Blocks of 32 MiB and
// more are still mapped and unmapped one by one (the stage streams pool
// theirs, HostBufferPool). Call it first thing in main, before threads
// start.
#ifndef PIPETRAIN_COMMON_HEAP_TUNING_H_
#define PIPETRAIN_COMMON_HEAP_TUNING_H_

#include <cstddef>
#include <functional>

namespace pipetrain {

enum class HeapTuning {
  kApplied,
  // The environment sets a threshold (MALLOC_TRIM_THRESHOLD_,
  // MALLOC_MMAP_THRESHOLD_, or glibc.malloc.trim_threshold /
  // mmap_threshold in GLIBC_TUNABLES): an operator's choice, left alone.
  kLeftToEnvironment,
  // Another allocator (AddressSanitizer's, ThreadSanitizer's), or mallopt
  // refused.
  kUnsupported,
};

inline constexpr size_t kHeapMmapThresholdBytes = size_t{32} << 20;
inline constexpr size_t kHeapTrimThresholdBytes = size_t{256} << 20;

HeapTuning KeepFreedHeapMemory();

// Whether an environment read through `getenv` sets either threshold.
bool HeapThresholdsSetByEnvironment(
    const std::function<const char*(const char*)>& getenv);

// A line for the process's log: what KeepFreedHeapMemory did.
const char* HeapTuningDescription(HeapTuning tuning);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_HEAP_TUNING_H_
