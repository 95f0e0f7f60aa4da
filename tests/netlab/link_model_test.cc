#include "tests/netlab/link_model.h"

#include "gtest/gtest.h"

namespace pipetrain::netlab {
namespace {

constexpr int64_t kMs = 1000000;

LinkParams Params(double mbit, double delay_ms) {
  LinkParams p;
  p.rate_bits_per_s = mbit * 1e6;
  p.delay_s = delay_ms * 1e-3;
  return p;
}

TEST(LinkModelTest, PacketsAreSerializedAtTheRateThenDelayed) {
  LinkModel link(Params(8, 20));  // 1 MB/s: 1000 bytes take 1 ms
  EXPECT_EQ(link.Admit(0, 1000, 0.5, 0), 21 * kMs);
  // Offered at the same time: it waits for the first to leave.
  EXPECT_EQ(link.Admit(0, 1000, 0.5, 0), 22 * kMs);
  // Offered after the link went idle: no wait.
  EXPECT_EQ(link.Admit(100 * kMs, 1000, 0.5, 0), 121 * kMs);
  EXPECT_EQ(link.counters().packets, 3);
  EXPECT_EQ(link.counters().bytes, 3000);
}

TEST(LinkModelTest, UnlimitedRateOnlyDelays) {
  LinkModel link(Params(0, 0.1));
  EXPECT_EQ(link.Admit(5 * kMs, 65000, 0.5, 0), 5 * kMs + kMs / 10);
  EXPECT_EQ(link.Admit(5 * kMs, 65000, 0.5, 0), 5 * kMs + kMs / 10);
}

TEST(LinkModelTest, AFullQueueDropsTheTail) {
  LinkParams p = Params(8, 0);
  p.queue_limit_bytes = 3000;
  LinkModel link(p);
  EXPECT_TRUE(link.Admit(0, 1000, 0.5, 0).has_value());
  EXPECT_TRUE(link.Admit(0, 1000, 0.5, 0).has_value());
  EXPECT_TRUE(link.Admit(0, 1000, 0.5, 0).has_value());
  EXPECT_FALSE(link.Admit(0, 1000, 0.5, 0).has_value());
  EXPECT_EQ(link.counters().dropped, 1);
  // Once a packet has left there is room again.
  EXPECT_TRUE(link.Admit(1 * kMs, 1000, 0.5, 0).has_value());
}

TEST(LinkModelTest, TheDefaultQueueHoldsTwiceTheBandwidthDelayProduct) {
  // 1 Gb/s, 20 ms one-way: 5 MB in flight per round trip.
  EXPECT_EQ(LinkModel(Params(1000, 20)).queue_limit_bytes(), 10000000);
  EXPECT_EQ(LinkModel(Params(10000, 0.1)).queue_limit_bytes(), kMinQueueBytes);
}

TEST(LinkModelTest, JitterNeverReorders) {
  LinkParams p = Params(0, 10);
  p.jitter_s = 5e-3;
  LinkModel link(p);
  EXPECT_EQ(link.Admit(0, 100, 0.5, 1.0), 15 * kMs);
  // Would arrive at 5 ms, before the packet sent ahead of it.
  EXPECT_EQ(link.Admit(0, 100, 0.5, -1.0), 15 * kMs);
  EXPECT_EQ(link.Admit(20 * kMs, 100, 0.5, -1.0), 25 * kMs);
}

TEST(LinkModelTest, LossDrawsBelowTheRateAreLost) {
  LinkParams p = Params(8, 1);
  p.loss = 0.01;
  LinkModel link(p);
  EXPECT_FALSE(link.Admit(0, 1000, 0.005, 0).has_value());
  EXPECT_EQ(link.counters().lost, 1);
  // The lost packet still took its time on the link.
  EXPECT_EQ(link.Admit(0, 1000, 0.5, 0), 3 * kMs);
}

}  // namespace
}  // namespace pipetrain::netlab
