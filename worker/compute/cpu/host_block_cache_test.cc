// The CPU backend's cache of freed tensor memory: a freed block serves the
// next request of its size, other sizes get their own, what is kept stays
// under the limit (the oldest go first), and tensors outlive their backend.
#include "worker/compute/cpu/host_block_cache.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/compute/cpu/cpu_backend.h"

namespace pipetrain {
namespace {

TEST(HostBlockCacheTest, AFreedBlockServesTheNextRequestOfItsSize) {
  if (!HostBlockCache::Keeps()) GTEST_SKIP() << "AddressSanitizer build";
  HostBlockCache cache(1 << 20);
  void* a = cache.Take(1000);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % HostBlockCache::kAlignment, 0u);
  std::memset(a, 1, HostBlockCache::RoundedSize(1000));
  cache.Give(a, 1000);
  EXPECT_EQ(cache.kept_bytes(), HostBlockCache::RoundedSize(1000));
  // Another size does not take it.
  void* b = cache.Take(5000);
  EXPECT_NE(b, a);
  EXPECT_EQ(cache.reused(), 0);
  // 1000 and 1010 bytes round to the same size.
  void* c = cache.Take(1010);
  EXPECT_EQ(c, a);
  EXPECT_EQ(cache.reused(), 1);
  EXPECT_EQ(cache.kept_bytes(), 0u);
  cache.Give(b, 5000);
  cache.Give(c, 1010);
}

TEST(HostBlockCacheTest, KeepsAtMostItsLimitAndFreesTheOldestFirst) {
  if (!HostBlockCache::Keeps()) GTEST_SKIP() << "AddressSanitizer build";
  constexpr size_t kBlock = 4096;
  HostBlockCache cache(3 * kBlock);
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(cache.Take(kBlock));
  for (void* b : blocks) cache.Give(b, kBlock);
  EXPECT_EQ(cache.kept_bytes(), 3 * kBlock);
  // The first given back went; the most recent comes back first.
  EXPECT_EQ(cache.Take(kBlock), blocks[3]);
  EXPECT_EQ(cache.Take(kBlock), blocks[2]);
  EXPECT_EQ(cache.Take(kBlock), blocks[1]);
  EXPECT_EQ(cache.kept_bytes(), 0u);
  for (int i = 1; i < 4; ++i) cache.Give(blocks[i], kBlock);
  // A block larger than the limit is never kept.
  void* big = cache.Take(4 * kBlock);
  cache.Give(big, 4 * kBlock);
  EXPECT_EQ(cache.kept_bytes(), 3 * kBlock);
}

// A request the system cannot meet gives back what is kept before it
// fails: kept memory never stands between a job and memory it could have.
TEST(HostBlockCacheTest, ARequestPastTheSystemsMemoryFreesWhatIsKept) {
  if (!HostBlockCache::Keeps()) GTEST_SKIP() << "AddressSanitizer build";
  HostBlockCache cache(1 << 20);
  cache.Give(cache.Take(4096), 4096);
  ASSERT_EQ(cache.kept_bytes(), 4096u);
  EXPECT_EQ(cache.Take(size_t{1} << 60), nullptr);
  EXPECT_EQ(cache.kept_bytes(), 0u);
}

TEST(HostBlockCacheTest, ThreadsTakeAndGiveAtOnce) {
  HostBlockCache cache(1 << 16);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&cache, t] {
      for (int i = 0; i < 2000; ++i) {
        const size_t bytes = 64 * (1 + (i + t) % 7);
        auto* p = static_cast<unsigned char*>(cache.Take(bytes));
        ASSERT_NE(p, nullptr);
        p[0] = static_cast<unsigned char>(t);
        p[bytes - 1] = static_cast<unsigned char>(i);
        cache.Give(p, bytes);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_LE(cache.kept_bytes(), size_t{1} << 16);
}

// Through the backend: the same shape again reuses the memory a freed
// tensor had; zero-filled tensors come back zeroed; a tensor may outlive
// the backend that made it.
TEST(HostBlockCacheTest, TheCpuBackendReusesFreedTensorMemory) {
  std::unique_ptr<Backend> backend = CreateCpuBackend(1);
  const float* first = nullptr;
  {
    auto t = backend->AllocateUninitialized({32, 2048});
    ASSERT_TRUE(t.ok()) << t.status();
    first = t->f32();
    for (int64_t i = 0; i < t->numel(); ++i) t->f32()[i] = 3.0f;
  }
  auto again = backend->Allocate({32, 2048});
  ASSERT_TRUE(again.ok()) << again.status();
  if (HostBlockCache::Keeps()) {
    EXPECT_EQ(again->f32(), first);
  }
  for (int64_t i = 0; i < again->numel(); ++i) {
    ASSERT_EQ(again->f32()[i], 0.0f) << i;
  }
  backend.reset();
  again->f32()[0] = 1.0f;  // still its memory
  EXPECT_EQ(again->f32()[0], 1.0f);
}

}  // namespace
}  // namespace pipetrain
