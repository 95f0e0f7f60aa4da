#include "services/rpc/control_queue.h"

namespace pipetrain {

ControlQueue::ControlQueue() : thread_([this] { Loop(); }) {}

ControlQueue::~ControlQueue() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void ControlQueue::Post(std::function<void()> task) {
  {
    absl::MutexLock lock(&mu_);
    tasks_.push_back(std::move(task));
  }
}

void ControlQueue::Loop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !tasks_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace pipetrain
