#include "scheduler/action_runner.h"

#include <utility>

namespace pipetrain {

ActionRunner::~ActionRunner() {
  WaitIdle();
  Reap();
}

void ActionRunner::Post(std::function<void()> task) {
  Reap();
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t id = next_id_++;
  ++running_;
  threads_[id] = std::thread([this, id, task = std::move(task)] {
    task();
    std::lock_guard<std::mutex> lock(mu_);
    finished_.push_back(id);
    --running_;
    cv_.notify_all();
  });
}

void ActionRunner::WaitIdle() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return running_ == 0;
  });
}

void ActionRunner::Reap() {
  std::vector<std::thread> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t id : finished_) {
      done.push_back(std::move(threads_.at(id)));
      threads_.erase(id);
    }
    finished_.clear();
  }
  // Outside the lock: a finished thread may still be returning from it.
  for (std::thread& t : done) t.join();
}

}  // namespace pipetrain
