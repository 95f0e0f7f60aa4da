#include "scheduler/action_runner.h"

#include <utility>

namespace pipetrain {

ActionRunner::~ActionRunner() {
  WaitIdle();
  Reap();
}

void ActionRunner::Post(std::function<void()> task) {
  Reap();
  absl::MutexLock lock(&mu_);
  const int64_t id = next_id_++;
  ++running_;
  threads_[id] = std::thread([this, id, task = std::move(task)] {
    task();
    absl::MutexLock lock(&mu_);
    finished_.push_back(id);
    --running_;
  });
}

void ActionRunner::WaitIdle() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_ == 0; };
  mu_.Await(absl::Condition(&idle));
}

void ActionRunner::Reap() {
  std::vector<std::thread> done;
  {
    absl::MutexLock lock(&mu_);
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
