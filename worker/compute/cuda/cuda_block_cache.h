// CudaBlockCache: device memory in size classes, with freed blocks kept for
// reuse so that a training step's repeated allocations of the same sizes do
// not call cudaMalloc (which is slow and synchronizes the device) each time.
//
// Blocks are reused in the order of the owning backend's single stream: a
// block released while kernels on that stream still use it can be handed out
// again at once, because whatever uses it next is issued on the same stream,
// after those kernels. Memory that another stream touches must be
// synchronized with before its last reference is dropped.
//
// Ownership: the backend and every tensor it allocated hold a shared_ptr to
// the cache, so tensors may outlive their backend; the cached memory is
// returned to the driver when the last of them is gone.
//
// Thread-safe: tensors may be dropped (and so blocks released) on any thread.
#ifndef PIPETRAIN_WORKER_COMPUTE_CUDA_CUDA_BLOCK_CACHE_H_
#define PIPETRAIN_WORKER_COMPUTE_CUDA_CUDA_BLOCK_CACHE_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace pipetrain {

class CudaBlockCache {
 public:
  explicit CudaBlockCache(int device);
  ~CudaBlockCache();
  CudaBlockCache(const CudaBlockCache&) = delete;
  CudaBlockCache& operator=(const CudaBlockCache&) = delete;

  // The size class of a request: at least 512 bytes, and otherwise rounded
  // up to a quarter of its power of two (at most 25% waste, few classes).
  static size_t RoundUp(size_t bytes);

  // A block of at least `bytes` (> 0) bytes, 256-byte aligned, from the free
  // list of its size class or from cudaMalloc. When the device is out of
  // memory, returns every cached block to the driver and tries once more.
  absl::StatusOr<void*> Acquire(size_t bytes);
  // Gives back a block from Acquire(bytes) for reuse.
  void Release(void* block, size_t bytes);
  // Returns every cached (free) block to the driver.
  void Trim();

  // Bytes held from the driver: lent out plus cached.
  size_t reserved_bytes() const;

 private:
  // Constant after construction.
  const int device_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<size_t, std::vector<void*>> free_ ABSL_GUARDED_BY(mu_);
  size_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// A scratch block that goes back to its cache when it leaves scope (after
// the kernels using it were issued; see the stream-order note above).
class ScratchBlock {
 public:
  ScratchBlock() = default;
  ScratchBlock(std::shared_ptr<CudaBlockCache> cache, void* data, size_t bytes)
      : cache_(std::move(cache)), data_(data), bytes_(bytes) {}
  ~ScratchBlock() {
    if (data_ != nullptr) cache_->Release(data_, bytes_);
  }
  ScratchBlock(ScratchBlock&& other) noexcept
      : cache_(std::move(other.cache_)),
        data_(other.data_),
        bytes_(other.bytes_) {
    other.data_ = nullptr;
  }
  ScratchBlock& operator=(ScratchBlock&&) = delete;
  ScratchBlock(const ScratchBlock&) = delete;
  ScratchBlock& operator=(const ScratchBlock&) = delete;

  float* f32() const { return static_cast<float*>(data_); }

 private:
  std::shared_ptr<CudaBlockCache> cache_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COMPUTE_CUDA_CUDA_BLOCK_CACHE_H_
