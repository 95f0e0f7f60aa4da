// ActionRunner: runs each task on a thread of its own, so one long task (a
// job's end-of-job evaluation, minutes) never holds up another (failing a
// job whose worker died) or the loop that posts them. Finished threads are
// joined when the next task is posted; the destructor waits for all.
//
// Thread-safe.
#ifndef PIPETRAIN_SCHEDULER_ACTION_RUNNER_H_
#define PIPETRAIN_SCHEDULER_ACTION_RUNNER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace pipetrain {

class ActionRunner {
 public:
  ActionRunner() = default;
  ActionRunner(const ActionRunner&) = delete;
  ActionRunner& operator=(const ActionRunner&) = delete;
  ~ActionRunner();

  void Post(std::function<void()> task);
  // Blocks until no task runs.
  void WaitIdle();

 private:
  // Joins threads whose task returned.
  void Reap();

  absl::Mutex mu_;
  std::map<int64_t, std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> finished_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_ACTION_RUNNER_H_
