#include "worker/compute/cpu/host_block_cache.h"

#include <cstdlib>
#include <iterator>

#include "common/sanitizer_build.h"

namespace pipetrain {
namespace {

// AddressSanitizer keeps nothing, so that a use after free is still caught.
constexpr bool kKeeps = !kAddressSanitizerBuild;

}  // namespace

HostBlockCache::HostBlockCache(size_t max_bytes)
    : max_bytes_(kKeeps ? max_bytes : 0) {}

HostBlockCache::~HostBlockCache() { Trim(); }

void HostBlockCache::Trim() {
  absl::MutexLock lock(&mu_);
  for (const Block& b : age_) std::free(b.data);
  age_.clear();
  by_size_.clear();
  kept_bytes_ = 0;
}

bool HostBlockCache::Keeps() { return kKeeps; }

size_t HostBlockCache::RoundedSize(size_t bytes) {
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  return rounded < kAlignment ? kAlignment : rounded;
}

void* HostBlockCache::Take(size_t bytes) {
  const size_t size = RoundedSize(bytes);
  {
    absl::MutexLock lock(&mu_);
    auto [first, last] = by_size_.equal_range(size);
    if (first != last) {
      const auto newest = std::prev(last);
      void* data = newest->second->data;
      age_.erase(newest->second);
      by_size_.erase(newest);
      kept_bytes_ -= size;
      ++reused_;
      return data;
    }
  }
  void* fresh = std::aligned_alloc(kAlignment, size);
  if (fresh != nullptr) return fresh;
  // Out of memory: what is kept goes back to the system, then once more.
  Trim();
  return std::aligned_alloc(kAlignment, size);
}

void HostBlockCache::Give(void* block, size_t bytes) {
  if (block == nullptr) return;
  const size_t size = RoundedSize(bytes);
  if (size > max_bytes_) {
    std::free(block);
    return;
  }
  absl::MutexLock lock(&mu_);
  // Room for it: the oldest blocks go first.
  while (kept_bytes_ + size > max_bytes_) {
    const Block oldest = age_.front();
    auto [first, last] = by_size_.equal_range(oldest.bytes);
    for (auto it = first; it != last; ++it) {
      if (it->second == age_.begin()) {
        by_size_.erase(it);
        break;
      }
    }
    age_.pop_front();
    kept_bytes_ -= oldest.bytes;
    std::free(oldest.data);
  }
  age_.push_back(Block{block, size});
  by_size_.emplace(size, std::prev(age_.end()));
  kept_bytes_ += size;
}

size_t HostBlockCache::kept_bytes() const {
  absl::MutexLock lock(&mu_);
  return kept_bytes_;
}

int64_t HostBlockCache::reused() const {
  absl::MutexLock lock(&mu_);
  return reused_;
}

}  // namespace pipetrain
