#include "services/wire/buffer_pool.h"

#include <cstdlib>

namespace pipetrain {

std::shared_ptr<HostBufferPool> HostBufferPool::Create(
    size_t max_cached_bytes) {
  return std::shared_ptr<HostBufferPool>(new HostBufferPool(max_cached_bytes));
}

HostBufferPool::~HostBufferPool() {
  for (auto& [bytes, data] : free_) std::free(data);
}

std::shared_ptr<Storage> HostBufferPool::Get(size_t bytes) {
  const size_t size = std::max<size_t>(bytes, 64);
  void* data = nullptr;
  {
    absl::MutexLock lock(&mu_);
    // Exact sizes only: messages repeat their sizes, and a larger buffer
    // would be wasted memory for as long as the tensor lives.
    auto it = free_.find(size);
    if (it != free_.end()) {
      data = it->second;
      cached_ -= size;
      free_.erase(it);
    }
  }
  if (data == nullptr) data = std::aligned_alloc(64, (size + 63) / 64 * 64);
  if (data == nullptr) return nullptr;
  std::shared_ptr<HostBufferPool> self = shared_from_this();
  return std::make_shared<Storage>(
      data, bytes, Device::kCpu,
      [self, size](void* p, size_t) { self->Put(p, size); });
}

void HostBufferPool::Put(void* data, size_t bytes) {
  {
    absl::MutexLock lock(&mu_);
    if (cached_ + bytes <= max_cached_bytes_) {
      free_.emplace(bytes, data);
      cached_ += bytes;
      return;
    }
  }
  std::free(data);
}

size_t HostBufferPool::cached_bytes() const {
  absl::MutexLock lock(&mu_);
  return cached_;
}

}  // namespace pipetrain
