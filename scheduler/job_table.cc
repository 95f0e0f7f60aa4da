#include "scheduler/job_table.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "scheduler/job_events.h"
#include "scheduler/job_state.h"

namespace pipetrain {

std::vector<std::string> JobRecord::Addresses() const {
  std::vector<std::string> out;
  if (!plan.has_value()) return out;
  for (const auto& s : plan->stages()) out.push_back(s.worker_address());
  return out;
}

JobTable::JobTable(StateWriter* writer) : writer_(writer) {}

void JobTable::Restore(std::vector<v1::Job> jobs,
                       std::map<std::string, v1::Plan> plans) {
  for (v1::Job& job : jobs) {
    auto record = std::make_unique<JobRecord>();
    auto plan = plans.find(job.id());
    if (plan != plans.end() && job.state() != v1::JOB_STATE_PENDING) {
      record->reports.resize(plan->second.stages_size());
      record->plan = std::move(plan->second);
    }
    for (const v1::EvalResult& e : job.evaluations()) {
      record->last_reported_eval_step =
          std::max(record->last_reported_eval_step, e.step());
    }
    int64_t n = 0;
    if (sscanf(job.id().c_str(), "job-%ld", &n) == 1) {
      next_id_ = std::max(next_id_, n + 1);
    }
    record->job = std::move(job);
    const std::string id = record->job.id();
    if (jobs_.count(id) == 0) order_.push_back(id);
    jobs_[id] = std::move(record);
  }
}

JobRecord* JobTable::Add(const v1::JobSpec& spec, int64_t now_ms) {
  auto record = std::make_unique<JobRecord>();
  v1::Job& job = record->job;
  job.set_id(absl::StrCat("job-", next_id_++));
  job.set_name(spec.training().name().empty() ? job.id()
                                              : spec.training().name());
  *job.mutable_spec() = spec;
  job.set_state(v1::JOB_STATE_PENDING);
  job.set_created_unix_ms(now_ms);
  job.set_updated_unix_ms(now_ms);
  job.set_total_steps(spec.training().steps());
  AddJobEvent(&job, v1::JOB_EVENT_SUBMITTED,
              absl::StrCat("submitted as ", job.name()), now_ms);
  JobRecord* out = record.get();
  order_.push_back(job.id());
  jobs_[job.id()] = std::move(record);
  Save(*out);
  return out;
}

absl::StatusOr<JobRecord*> JobTable::Find(const std::string& id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  }
  return it->second.get();
}

absl::Status JobTable::Transition(JobRecord* record, v1::JobState to,
                                  int64_t now_ms) {
  v1::Job& job = record->job;
  RETURN_IF_ERROR(CheckJobTransition(job.state(), to));
  PT_LOG(INFO) << job.id() << ": " << v1::JobState_Name(job.state()) << " -> "
               << v1::JobState_Name(to);
  const v1::JobEventKind kind = EventForTransition(job.state(), to);
  if (kind == v1::JOB_EVENT_STARTED) {
    AddJobEvent(&job, kind,
                absl::StrCat("training from step ", job.step(), " to ",
                             job.total_steps()),
                now_ms, {job.step(), job.committed_version(), 0});
  } else if (kind != v1::JOB_EVENT_UNSPECIFIED) {
    // A failure's event carries its reason (set before the move).
    AddJobEvent(&job, kind,
                to == v1::JOB_STATE_FAILED ? job.error() : std::string(),
                now_ms, {job.step(), job.committed_version(), 0});
  }
  job.set_state(to);
  job.set_updated_unix_ms(now_ms);
  Save(*record);
  return absl::OkStatus();
}

void JobTable::SetPlan(JobRecord* record, v1::Plan plan) {
  record->reports.assign(plan.stages_size(), v1::StageReport());
  record->results_taken.clear();
  record->recent_step_seconds.clear();
  if (writer_ != nullptr) writer_->PutPlan(plan);
  record->plan = std::move(plan);
}

void JobTable::ClearPlan(JobRecord* record) {
  record->plan.reset();
  record->reports.clear();
  record->results_taken.clear();
  record->recent_step_seconds.clear();
  record->job.clear_stages();
}

void JobTable::Save(const JobRecord& record) {
  if (writer_ != nullptr) writer_->PutJob(record.job);
}

}  // namespace pipetrain
