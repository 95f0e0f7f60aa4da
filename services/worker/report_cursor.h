// ReportCursor: which of its stage's step results a worker's next
// heartbeat carries (WorkerAgent).
//
// A result is reported again in every heartbeat until a response from the
// same scheduler process shows its ledger record on disk
// (HeartbeatResponse.report_sequence / durable_sequence): a scheduler
// acknowledges a report before its write-behind flush, and one killed in
// between would otherwise lose the results for good if the worker died
// before learning of the new scheduler process. A new configuration (a
// new job, or the same job resumed after a recovery) is reported from its
// first result, and so is everything after a heartbeat failed, the
// scheduler process changed or it asked the worker to register again.
//
// Not thread-safe: the agent's thread owns it.
#ifndef PIPETRAIN_SERVICES_WORKER_REPORT_CURSOR_H_
#define PIPETRAIN_SERVICES_WORKER_REPORT_CURSOR_H_

#include <cstdint>
#include <deque>
#include <string>

#include "pipetrain/v1/scheduler.pb.h"

namespace pipetrain {

class ReportCursor {
 public:
  // The step the next report's results start at, if its configuration is
  // the one reported last.
  int64_t since() const { return durable_since_; }
  // A report of another configuration than the one reported last: it is
  // to be reported from its first result (step 0).
  bool IsNew(const v1::StageReport& report) const;

  // The heartbeat that carried `report` (null: none) was answered.
  void Answered(const v1::StageReport* report,
                const v1::HeartbeatResponse& response);
  // The scheduler may have lost what it was told (a heartbeat failed):
  // report every result again.
  void ReportAll() { attempt_ = -1; }

 private:
  std::string job_;
  int64_t attempt_ = -1;
  // Every result before it is on the scheduler's disk (or was ignored).
  int64_t durable_since_ = 0;
  // Reports acknowledged but not yet on disk, oldest first: the record
  // the scheduler queued them by and the step after their last result.
  struct Unsettled {
    uint64_t sequence;
    int64_t next_since;
  };
  std::deque<Unsettled> unsettled_;
  // HeartbeatResponse.scheduler_instance last seen.
  std::string instance_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_WORKER_REPORT_CURSOR_H_
