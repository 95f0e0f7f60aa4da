// SchedulerCore::GetJobTrace: every stage's recent instruction trace,
// merged and rendered in the Chrome trace event format, so a user can see
// the pipeline (forward/backward blocks per stage, the bubbles between them)
// in chrome://tracing or Perfetto and find stalls.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "scheduler/job_entry.h"
#include "scheduler/scheduler_core.h"

namespace pipetrain {
namespace {

// The trace category of an instruction name ("F3" -> forward, ...).
const char* Category(const std::string& op) {
  if (op.rfind("Send", 0) == 0 || op.rfind("Recv", 0) == 0) return "transfer";
  if (op.rfind("BI", 0) == 0) return "backward-input";
  if (op.rfind("W", 0) == 0) return "backward-weight";
  if (op.rfind("B", 0) == 0) return "backward";
  if (op.rfind("F", 0) == 0) return "forward";
  if (op.rfind("Loss", 0) == 0) return "loss";
  if (op.rfind("Load", 0) == 0) return "data";
  return "optimizer";
}

std::string ChromeTraceJson(const v1::Plan& plan,
                            const std::vector<v1::TraceEvent>& events) {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  bool first = true;
  auto add = [&](const std::string& event) {
    if (!first) out += ",";
    out += event;
    first = false;
  };
  for (const v1::PlannedStage& s : plan.stages()) {
    add(absl::StrFormat(
        "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{"
        "\"name\":\"stage %d: layers [%d, %d) on %s\"}}",
        s.stage(), s.stage(), s.layer_begin(), s.layer_end(), s.worker_id()));
  }
  for (const v1::TraceEvent& e : events) {
    add(absl::StrFormat(
        "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,"
        "\"ts\":%d,\"dur\":%d,\"args\":{\"step\":%d,\"micro_batch\":%d,"
        "\"weight_version\":%d}}",
        e.op(), Category(e.op()), e.stage(), e.chunk(), e.start_unix_us(),
        std::max<int64_t>(0, e.end_unix_us() - e.start_unix_us()), e.step(),
        e.micro_batch(), e.weight_version()));
  }
  out += "]}";
  return out;
}

}  // namespace

absl::StatusOr<v1::GetJobTraceResponse> SchedulerCore::GetJobTrace(
    const v1::GetJobTraceRequest& request) {
  v1::Plan plan;
  int64_t since = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSIGN_OR_RETURN(JobEntry * e, Find(request.job_id()));
    if (!e->has_plan) {
      return absl::FailedPreconditionError(
          absl::StrCat(request.job_id(), " has not started; no trace yet"));
    }
    plan = e->plan;
    const int64_t last = request.last_steps() > 0 ? request.last_steps() : 5;
    since = std::max<int64_t>(0, e->job.step() - last);
  }
  v1::GetJobTraceResponse out;
  std::vector<v1::TraceEvent> events;
  for (const v1::PlannedStage& s : plan.stages()) {
    ASSIGN_OR_RETURN(
        v1::GetTraceResponse r,
        control_->GetTrace(s.worker_address(), request.job_id(), since));
    for (v1::TraceEvent& e : *r.mutable_events()) {
      events.push_back(std::move(e));
    }
  }
  std::sort(events.begin(), events.end(),
            [](const v1::TraceEvent& a, const v1::TraceEvent& b) {
              return a.start_unix_us() < b.start_unix_us();
            });
  out.set_chrome_trace_json(ChromeTraceJson(plan, events));
  for (v1::TraceEvent& e : events) *out.add_events() = std::move(e);
  return out;
}

}  // namespace pipetrain
