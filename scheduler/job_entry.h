// SchedulerCore's record of one job; shared by its two source files.
#ifndef PIPETRAIN_SCHEDULER_JOB_ENTRY_H_
#define PIPETRAIN_SCHEDULER_JOB_ENTRY_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "scheduler/scheduler_core.h"

namespace pipetrain {

// Wall-clock milliseconds since the Unix epoch.
inline int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Guarded by SchedulerCore::mu_.
struct SchedulerCore::JobEntry {
  v1::Job job;
  v1::Plan plan;
  bool has_plan = false;
  // Latest report per stage.
  std::vector<v1::StageReport> reports;
  std::deque<double> recent_step_seconds;  // last stage, newest last
  // A control action (start, finish, fail) is in progress off the lock.
  bool busy = false;

  std::vector<std::string> Addresses() const {
    std::vector<std::string> out;
    for (const auto& s : plan.stages()) out.push_back(s.worker_address());
    return out;
  }
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_JOB_ENTRY_H_
