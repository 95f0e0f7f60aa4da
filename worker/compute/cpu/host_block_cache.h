// Freed host tensor memory kept for reuse.
//
// A training step allocates and frees the same tensors every micro-batch
// and every step (activations, their gradients, GEMM outputs). Freed
// through the C allocator, blocks of a few hundred KiB and up went back to
// the system (an arena's trimmed top, an mmap'd chunk) and came back as
// fresh pages, a page fault per 4 KiB on first touch: bench_scaling's MLP
// stages took about 2,500 faults a second. The CPU backend takes its
// tensors' memory from a HostBlockCache instead: a freed block is kept,
// keyed by its size, and the next request of that size reuses it (the most
// recently freed first, likeliest to be in cache). The cache keeps at most
// `max_bytes` of free blocks; past that it frees the oldest.
//
// Built with AddressSanitizer, nothing is kept (max_bytes is ignored), so a
// use after free is still caught.
//
// Thread-safe: tensors are freed on whichever thread drops the last
// reference (gRPC's, once it has written a message's slices).
#ifndef PIPETRAIN_WORKER_COMPUTE_CPU_HOST_BLOCK_CACHE_H_
#define PIPETRAIN_WORKER_COMPUTE_CPU_HOST_BLOCK_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace pipetrain {

class HostBlockCache {
 public:
  // Blocks are aligned to, and sized in multiples of, kAlignment bytes.
  static constexpr size_t kAlignment = 64;

  explicit HostBlockCache(size_t max_bytes);
  ~HostBlockCache();  // frees the blocks kept
  HostBlockCache(const HostBlockCache&) = delete;
  HostBlockCache& operator=(const HostBlockCache&) = delete;

  // False when built with AddressSanitizer: nothing is kept.
  static bool Keeps();
  // The size a request for `bytes` takes: a multiple of kAlignment, at
  // least kAlignment.
  static size_t RoundedSize(size_t bytes);
  // A block of RoundedSize(bytes) bytes: a kept one of that size, else a
  // new one; null when the system has no memory to give even after every
  // kept block went back to it.
  void* Take(size_t bytes);
  // Takes back a block from Take(bytes): kept for reuse, or freed.
  void Give(void* block, size_t bytes);

  // Gives every kept block back to the system.
  void Trim();

  // Bytes of free blocks kept, and how many requests reused one.
  size_t kept_bytes() const;
  int64_t reused() const;

 private:
  struct Block {
    void* data;
    size_t bytes;
  };
  using Age = std::list<Block>;  // oldest first

  const size_t max_bytes_;
  mutable absl::Mutex mu_;
  Age age_ ABSL_GUARDED_BY(mu_);
  // By size; within one size, in the order they were given back.
  std::multimap<size_t, Age::iterator> by_size_ ABSL_GUARDED_BY(mu_);
  size_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reused_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COMPUTE_CPU_HOST_BLOCK_CACHE_H_
