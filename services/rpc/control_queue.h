// ControlQueue: one thread that runs control-plane work (building models,
// profiling, joining threads) so gRPC reactions never block on it.
// Thread-safe. Tasks run in FIFO order; the destructor runs what is queued
// and joins.
#ifndef PIPETRAIN_SERVICES_RPC_CONTROL_QUEUE_H_
#define PIPETRAIN_SERVICES_RPC_CONTROL_QUEUE_H_

#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace pipetrain {

class ControlQueue {
 public:
  ControlQueue();
  ~ControlQueue();
  ControlQueue(const ControlQueue&) = delete;
  ControlQueue& operator=(const ControlQueue&) = delete;

  void Post(std::function<void()> task);

 private:
  void Loop();
  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_RPC_CONTROL_QUEUE_H_
