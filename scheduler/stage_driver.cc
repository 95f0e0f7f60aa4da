#include "scheduler/stage_driver.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "scheduler/recovery_plan.h"

namespace pipetrain {
namespace {

// `status` with "stage S (ADDRESS): " before its message, same code.
absl::Status AtStage(const absl::Status& status, int stage,
                     const std::string& address) {
  return absl::Status(
      status.code(),
      absl::StrCat("stage ", stage, " (", address, "): ", status.message()));
}

}  // namespace

std::vector<v1::StageConfig> StageConfigs(const std::string& job_id,
                                          const v1::JobSpec& spec,
                                          const v1::Plan& plan,
                                          double recv_timeout_seconds) {
  const int k = plan.stages_size();
  std::vector<v1::StageConfig> out(k);
  for (int s = 0; s < k; ++s) {
    const v1::PlannedStage& stage = plan.stages(s);
    v1::StageConfig& config = out[s];
    config.set_job_id(job_id);
    *config.mutable_spec() = spec.training();
    config.set_stage(s);
    config.set_num_stages(k);
    config.set_layer_begin(stage.layer_begin());
    config.set_layer_end(stage.layer_end());
    if (s + 1 < k) config.set_downstream(plan.stages(s + 1).worker_address());
    // The one peer allowed to stream to this stage.
    if (s > 0)
      config.set_upstream_identity(plan.stages(s - 1).worker_identity());
    if (stage.chunks_size() > 0) {
      // Chunk c of worker s feeds chunk c (or c + 1, from the last worker)
      // of the next worker, so the last one links to the first.
      config.set_virtual_stages(stage.chunks_size());
      *config.mutable_chunks() = stage.chunks();
      config.set_downstream(plan.stages((s + 1) % k).worker_address());
      config.set_upstream_identity(
          plan.stages((s + k - 1) % k).worker_identity());
    }
    config.set_schedule(spec.schedule());
    config.set_wire_dtype(spec.wire_dtype());
    *config.mutable_wire_compression() = spec.wire_compression();
    config.set_recv_timeout_s(recv_timeout_seconds);
    config.set_vertical_sync(spec.vertical_sync());
    config.set_extra_warmup(plan.extra_warmup());
  }
  return out;
}

int64_t TotalSteps(const v1::TrainingSpec& spec, int64_t steps_per_epoch) {
  return spec.steps() > 0 ? spec.steps() : spec.epochs() * steps_per_epoch;
}

absl::StatusOr<int64_t> LaunchStages(
    StageControl* control, const std::string& job_id, const v1::JobSpec& spec,
    const v1::Plan& plan, double recv_timeout_seconds, const StageStart& start,
    int* failed_stage) {
  const auto failed = [&](const absl::Status& status, int s) {
    if (failed_stage != nullptr) *failed_stage = s;
    return AtStage(status, s, plan.stages(s).worker_address());
  };
  std::vector<v1::StageConfig> configs =
      StageConfigs(job_id, spec, plan, recv_timeout_seconds);
  for (v1::StageConfig& c : configs) {
    c.set_start_step(start.step);
    c.set_restore_expected(start.state != nullptr);
    c.set_attempt(start.attempt);
  }
  int64_t steps_per_epoch = 0;
  for (int s = plan.stages_size() - 1; s >= 0; --s) {
    const std::string& address = plan.stages(s).worker_address();
    absl::StatusOr<v1::ConfigureResponse> r =
        control->Configure(address, configs[s]);
    if (!r.ok()) return failed(r.status(), s);
    if (s == 0) steps_per_epoch = r->steps_per_epoch();
  }
  for (int s = 0; start.state != nullptr && s < plan.stages_size(); ++s) {
    const std::string& address = plan.stages(s).worker_address();
    absl::StatusOr<int64_t> r = control->RestoreState(
        address, job_id, start.info, StateForStage(*start.state, configs[s]));
    if (!r.ok()) return failed(r.status(), s);
  }
  const int64_t total = TotalSteps(spec.training(), steps_per_epoch);
  for (int s = plan.stages_size() - 1; start.train && s >= 0; --s) {
    const std::string& address = plan.stages(s).worker_address();
    absl::StatusOr<int64_t> r = control->Train(address, job_id, total);
    if (!r.ok()) return failed(r.status(), s);
  }
  return total;
}

absl::StatusOr<int64_t> PauseStages(StageControl* control,
                                    const std::vector<std::string>& addresses,
                                    const std::string& job_id) {
  if (addresses.empty()) return absl::InvalidArgumentError("no stages");
  // Stage 0 names the first step it can stop at. A later stage may already
  // be inside that step (waiting for its activations) and answer one step
  // later; then every stage, stage 0 first, is given the later target, so
  // that all of them stop at the same step. Targets only grow, so this
  // settles within a few rounds.
  int64_t want = 0;
  for (int round = 0; round < 4; ++round) {
    absl::StatusOr<int64_t> target = control->Train(addresses[0], job_id, want);
    if (!target.ok()) return AtStage(target.status(), 0, addresses[0]);
    int64_t agreed = *target;
    for (size_t s = 1; s < addresses.size(); ++s) {
      absl::StatusOr<int64_t> r = control->Train(addresses[s], job_id, agreed);
      if (!r.ok()) return AtStage(r.status(), s, addresses[s]);
      agreed = std::max(agreed, *r);
    }
    if (agreed == *target) return agreed;
    want = agreed;
  }
  return absl::AbortedError(
      "the stages did not agree on a step to pause at; try again");
}

absl::Status ResumeStages(StageControl* control,
                          const std::vector<std::string>& addresses,
                          const std::string& job_id, int64_t total_steps) {
  for (size_t s = addresses.size(); s-- > 0;) {
    absl::StatusOr<int64_t> r =
        control->Train(addresses[s], job_id, total_steps);
    if (!r.ok()) return AtStage(r.status(), s, addresses[s]);
  }
  return absl::OkStatus();
}

void StopStages(StageControl* control,
                const std::vector<std::string>& addresses,
                const std::string& job_id) {
  for (const std::string& address : addresses) {
    const absl::Status s = control->Stop(address, job_id);
    if (!s.ok() && !absl::IsUnavailable(s) && !absl::IsNotFound(s)) {
      PT_LOG(WARNING) << "stopping " << job_id << " on " << address << ": "
                      << s;
    }
  }
}

absl::StatusOr<v1::EvalResult> EvaluateStages(
    StageControl* control, const std::vector<std::string>& addresses,
    const std::string& job_id, int64_t max_samples) {
  if (addresses.empty()) return absl::InvalidArgumentError("no stages");
  const size_t k = addresses.size();
  std::vector<absl::StatusOr<v1::EvalResult>> results(
      k, absl::UnknownError("not called"));
  std::vector<std::thread> calls;
  // Stages 1..K-1 on their own threads, stage 0 (the data) on this one.
  for (size_t s = 1; s < k; ++s) {
    calls.emplace_back([&, s] {
      results[s] = control->Evaluate(addresses[s], job_id, max_samples);
    });
  }
  results[0] = control->Evaluate(addresses[0], job_id, max_samples);
  for (std::thread& t : calls) t.join();
  // One stage's failure often breaks its neighbours' streams too: name
  // every failed stage, with the first one's code.
  absl::Status failed;
  std::string message;
  for (size_t s = 0; s < k; ++s) {
    if (results[s].ok()) continue;
    const absl::Status at = AtStage(results[s].status(), s, addresses[s]);
    if (failed.ok()) failed = at;
    absl::StrAppend(&message, message.empty() ? "" : "; ", at.message());
  }
  if (!failed.ok()) return absl::Status(failed.code(), message);
  return results[k - 1];
}

absl::StatusOr<std::vector<v1::TraceEvent>> CollectTraces(
    StageControl* control, const v1::Plan& plan, const std::string& job_id,
    int64_t since_step) {
  std::vector<v1::TraceEvent> events;
  for (const v1::PlannedStage& s : plan.stages()) {
    absl::StatusOr<v1::GetTraceResponse> r =
        control->GetTrace(s.worker_address(), job_id, since_step);
    if (!r.ok()) return AtStage(r.status(), s.stage(), s.worker_address());
    for (v1::TraceEvent& e : *r->mutable_events()) {
      events.push_back(std::move(e));
    }
  }
  return events;
}

}  // namespace pipetrain
