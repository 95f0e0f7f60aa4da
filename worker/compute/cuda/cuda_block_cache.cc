#include "worker/compute/cuda/cuda_block_cache.h"

#include <cuda_runtime_api.h>

#include "worker/compute/cuda/cuda_status.h"

namespace pipetrain {
namespace {

// Makes `device` current for the scope and restores the previous one, so
// that releasing memory never changes the caller's current device.
class ScopedCudaDevice {
 public:
  explicit ScopedCudaDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) (void)cudaSetDevice(device);
  }
  ~ScopedCudaDevice() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
    (void)cudaGetLastError();
  }

 private:
  int previous_ = -1;
};

}  // namespace

CudaBlockCache::CudaBlockCache(int device) : device_(device) {}

CudaBlockCache::~CudaBlockCache() {
  // Errors are ignored: at process exit the runtime may already be gone.
  Trim();
}

size_t CudaBlockCache::RoundUp(size_t bytes) {
  constexpr size_t kMinBlock = 512;
  if (bytes <= kMinBlock) return kMinBlock;
  size_t power = kMinBlock;
  while (power * 2 <= bytes) power *= 2;
  const size_t step = power / 4;
  return (bytes + step - 1) / step * step;
}

absl::StatusOr<void*> CudaBlockCache::Acquire(size_t bytes) {
  const size_t size = RoundUp(bytes);
  {
    absl::MutexLock lock(&mu_);
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      void* block = it->second.back();
      it->second.pop_back();
      return block;
    }
  }
  void* block = nullptr;
  cudaError_t err = cudaMalloc(&block, size);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    Trim();
    err = cudaMalloc(&block, size);
  }
  RETURN_IF_CUDA_ERR(err);
  absl::MutexLock lock(&mu_);
  reserved_bytes_ += size;
  return block;
}

void CudaBlockCache::Release(void* block, size_t bytes) {
  absl::MutexLock lock(&mu_);
  free_[RoundUp(bytes)].push_back(block);
}

void CudaBlockCache::Trim() {
  absl::flat_hash_map<size_t, std::vector<void*>> blocks;
  {
    absl::MutexLock lock(&mu_);
    blocks.swap(free_);
    for (const auto& [size, list] : blocks) {
      reserved_bytes_ -= size * list.size();
    }
  }
  if (blocks.empty()) return;
  ScopedCudaDevice scoped(device_);
  for (const auto& [size, list] : blocks) {
    for (void* block : list) (void)cudaFree(block);
  }
}

size_t CudaBlockCache::reserved_bytes() const {
  absl::MutexLock lock(&mu_);
  return reserved_bytes_;
}

}  // namespace pipetrain
