// The mailbox between a stage's network edge and its executor: messages
// delivered from several threads in any order reach the receiver waiting
// for each key exactly once; a failure wakes every waiter. Run under
// ThreadSanitizer by `make tsan`.
#include "worker/pipeline/mailbox.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using Clock = std::chrono::steady_clock;

StageMessage Message(MessageKind kind, int64_t step, int32_t micro_batch) {
  StageMessage m;
  m.kind = kind;
  m.step = step;
  m.micro_batch = micro_batch;
  m.value = static_cast<double>(step * 100 + micro_batch);
  return m;
}

// Ready answers whether a Receive would return at once, without taking the
// message: the executor asks before it waits.
TEST(Mailbox, ReadyTellsWhetherAReceiveWouldWait) {
  Mailbox mailbox;
  EXPECT_FALSE(mailbox.Ready(MessageKind::kGradient, 3, 1, 0));
  ASSERT_TRUE(mailbox.Deliver(Message(MessageKind::kGradient, 3, 1)).ok());
  EXPECT_TRUE(mailbox.Ready(MessageKind::kGradient, 3, 1, 0));
  EXPECT_TRUE(mailbox.Ready(MessageKind::kGradient, 3, 1, 0));
  EXPECT_FALSE(mailbox.Ready(MessageKind::kActivation, 3, 1, 0));
  EXPECT_FALSE(mailbox.Ready(MessageKind::kGradient, 3, 2, 0));
  auto m = mailbox.Receive(MessageKind::kGradient, 3, 1, 0,
                           Clock::now() + std::chrono::seconds(30));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(mailbox.Ready(MessageKind::kGradient, 3, 1, 0));
  // After a failure every Receive returns at once (with the failure).
  mailbox.Fail(absl::UnavailableError("link broke"));
  EXPECT_TRUE(mailbox.Ready(MessageKind::kActivation, 9, 0, 0));
}

TEST(Mailbox, MessagesFromManyThreadsReachTheirReceiversOnce) {
  constexpr int kSteps = 50;
  constexpr int kMicroBatches = 8;
  Mailbox mailbox;
  // Four senders deliver interleaved slices of every step's messages, in
  // reverse order within a step, while two receivers wait for them in
  // schedule order (one per message kind).
  std::vector<std::thread> senders;
  for (int t = 0; t < 4; ++t) {
    senders.emplace_back([&mailbox, t] {
      for (int step = 0; step < kSteps; ++step) {
        for (int mb = kMicroBatches - 1; mb >= 0; --mb) {
          if (mb % 4 != t) continue;
          for (MessageKind kind :
               {MessageKind::kGradient, MessageKind::kActivation}) {
            ASSERT_TRUE(mailbox.Deliver(Message(kind, step, mb)).ok());
          }
        }
      }
    });
  }
  std::atomic<int> received{0};
  std::vector<std::thread> receivers;
  for (MessageKind kind : {MessageKind::kActivation, MessageKind::kGradient}) {
    receivers.emplace_back([&mailbox, &received, kind] {
      for (int step = 0; step < kSteps; ++step) {
        for (int mb = 0; mb < kMicroBatches; ++mb) {
          auto m = mailbox.Receive(kind, step, mb, 0,
                                   Clock::now() + std::chrono::seconds(30));
          ASSERT_TRUE(m.ok()) << m.status();
          EXPECT_EQ(m->kind, kind);
          EXPECT_EQ(m->value, step * 100 + mb);
          ++received;
        }
      }
    });
  }
  for (std::thread& t : senders) t.join();
  for (std::thread& t : receivers) t.join();
  EXPECT_EQ(received.load(), 2 * kSteps * kMicroBatches);
  EXPECT_EQ(mailbox.size(), 0u);
}

TEST(Mailbox, ADuplicateIsRefusedAndTheFirstKept) {
  Mailbox mailbox;
  ASSERT_TRUE(mailbox.Deliver(Message(MessageKind::kActivation, 3, 1)).ok());
  StageMessage again = Message(MessageKind::kActivation, 3, 1);
  again.value = -1;
  EXPECT_EQ(mailbox.Deliver(again).code(), absl::StatusCode::kAlreadyExists);
  auto m = mailbox.Receive(MessageKind::kActivation, 3, 1, 0,
                           Clock::now() + std::chrono::seconds(1));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->value, 301);
}

TEST(Mailbox, AFailureWakesEveryWaiterUntilReset) {
  Mailbox mailbox;
  std::vector<std::thread> waiters;
  std::atomic<int> failed{0};
  for (int i = 0; i < 3; ++i) {
    waiters.emplace_back([&mailbox, &failed, i] {
      auto m = mailbox.Receive(MessageKind::kGradient, 7, i, 0,
                               Clock::now() + std::chrono::seconds(60));
      if (!m.ok() && m.status().message() == "upstream stream broke") ++failed;
    });
  }
  // The waiters are woken by the failure, not by their 60 s deadline.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto before = Clock::now();
  mailbox.Fail(absl::UnavailableError("upstream stream broke"));
  for (std::thread& t : waiters) t.join();
  EXPECT_LT(Clock::now() - before, std::chrono::seconds(30));
  EXPECT_EQ(failed.load(), 3);
  // Later receives fail at once; a failed mailbox drops deliveries.
  EXPECT_EQ(mailbox
                .Receive(MessageKind::kGradient, 8, 0, 0,
                         Clock::now() + std::chrono::seconds(60))
                .status()
                .code(),
            absl::StatusCode::kUnavailable);
  mailbox.Reset();
  ASSERT_TRUE(mailbox.Deliver(Message(MessageKind::kGradient, 8, 0)).ok());
  EXPECT_TRUE(mailbox
                  .Receive(MessageKind::kGradient, 8, 0, 0,
                           Clock::now() + std::chrono::seconds(1))
                  .ok());
}

TEST(Mailbox, ADeadlineNamesTheMessageAwaited) {
  Mailbox mailbox;
  auto m = mailbox.Receive(MessageKind::kActivation, 4, 2, 0,
                           Clock::now() + std::chrono::milliseconds(20));
  ASSERT_EQ(m.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(m.status().message().find("4"), std::string::npos) << m.status();
}

TEST(Mailbox, DropBeforeForgetsOlderSteps) {
  Mailbox mailbox;
  for (int step = 0; step < 4; ++step) {
    ASSERT_TRUE(
        mailbox.Deliver(Message(MessageKind::kActivation, step, 0)).ok());
  }
  mailbox.DropBefore(2);
  EXPECT_EQ(mailbox.size(), 2u);
  EXPECT_FALSE(mailbox
                   .Receive(MessageKind::kActivation, 1, 0, 0,
                            Clock::now() + std::chrono::milliseconds(10))
                   .ok());
  EXPECT_TRUE(mailbox
                  .Receive(MessageKind::kActivation, 2, 0, 0,
                           Clock::now() + std::chrono::milliseconds(10))
                  .ok());
}

}  // namespace
}  // namespace pipetrain
