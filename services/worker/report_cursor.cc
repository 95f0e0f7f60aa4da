#include "services/worker/report_cursor.h"

#include <algorithm>

namespace pipetrain {

bool ReportCursor::IsNew(const v1::StageReport& report) const {
  return report.job_id() != job_ || report.attempt() != attempt_;
}

void ReportCursor::Answered(const v1::StageReport* report,
                            const v1::HeartbeatResponse& response) {
  if (response.register_again()) {
    // A scheduler that does not know this worker (one restarted before it
    // had written the registration down) dropped the report with it.
    ReportAll();
    return;
  }
  // Another scheduler process: its record numbers are not its
  // predecessor's, so only this report's record counts (it carried every
  // unsettled result).
  const bool other_process = response.scheduler_instance() != instance_;
  if (other_process) unsettled_.clear();
  if (report != nullptr) {
    int64_t next_since = durable_since_;
    if (IsNew(*report)) {
      job_ = report->job_id();
      attempt_ = report->attempt();
      durable_since_ = 0;
      next_since = 0;
      unsettled_.clear();
    }
    for (const v1::StepResult& r : report->status().results()) {
      next_since = std::max(next_since, r.step() + 1);
    }
    if (response.report_sequence() == 0) {
      // Ignored (a stage of an earlier configuration) or not kept (a
      // scheduler without state): nothing to wait for.
      durable_since_ = std::max(durable_since_, next_since);
      unsettled_.clear();
    } else {
      unsettled_.push_back({response.report_sequence(), next_since});
    }
  }
  while (!unsettled_.empty() &&
         unsettled_.front().sequence <= response.durable_sequence()) {
    durable_since_ = std::max(durable_since_, unsettled_.front().next_since);
    unsettled_.pop_front();
  }
  if (other_process) {
    // Report every result again as well, for a scheduler whose disk holds
    // less than its predecessor wrote (one restored from an older copy).
    if (!instance_.empty()) ReportAll();
    instance_ = response.scheduler_instance();
  }
}

}  // namespace pipetrain
