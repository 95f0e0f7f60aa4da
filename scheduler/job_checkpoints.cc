// SchedulerCore's checkpoint coordination. Stages snapshot their state into
// host memory at step boundaries: by themselves at multiples of the spec's
// checkpoint_every, or when asked (Snapshot, at a step just ahead of stage
// 0: every checkpoint_interval_seconds when checkpoint_every is 0, or on a
// user's request). Once every stage has passed that boundary, a background
// thread fetches each stage's snapshot while training goes on, writes it
// layer by layer into the CheckpointStore and commits it, so a checkpoint is
// listed only when complete. Nothing here makes the job busy: a recovery may
// run meanwhile, and a fetch it breaks commits nothing.
#include <algorithm>
#include <chrono>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "scheduler/job_events.h"
#include "scheduler/recovery_plan.h"
#include "scheduler/scheduler_core.h"
#include "scheduler/state_tensor.h"

namespace pipetrain {
namespace {

// Steps ahead of stage 0's last report a requested snapshot starts: reports
// lag the stage by a heartbeat, so ask a little further on.
constexpr int64_t kSnapshotLead = 2;
constexpr int kSnapshotRounds = 5;

// The one conversion of the store's record to the API's message.
v1::CheckpointInfo ToProto(const CheckpointInfo& c) {
  v1::CheckpointInfo out;
  out.set_job_id(c.job_id);
  out.set_version(c.version);
  out.set_step(c.step);
  out.set_optimizer_steps(c.optimizer_steps);
  out.set_bytes(c.bytes);
  out.set_created_unix_ms(c.created_unix_ms);
  out.set_num_layers(c.num_layers);
  out.set_write_seconds(c.write_seconds);
  return out;
}

int KeepCheckpoints(const v1::JobSpec& spec) {
  const int keep = spec.training().keep_checkpoints();
  return keep > 0 ? keep : 3;
}

}  // namespace

std::optional<SchedulerCore::Action> SchedulerCore::CheckpointDue(
    JobRecord* r) {
  if (options_.checkpoints == nullptr || r->checkpoint_in_flight ||
      r->resume_step >= 0 || r->snapshot_step == -2) {
    return std::nullopt;
  }
  const v1::Job& job = r->job;
  const int64_t every = job.spec().training().checkpoint_every();
  // Every stage has passed the boundary when the slowest one has.
  const int64_t passed = job.step();
  int64_t due = -1;
  if (r->snapshot_step > 0 && passed >= r->snapshot_step) {
    due = r->snapshot_step;
  } else if (every > 0) {
    const int64_t m = passed / every * every;
    if (m > r->last_checkpoint_step && m < job.total_steps()) due = m;
  }
  if (due > 0) {
    r->checkpoint_in_flight = true;
    if (due == r->snapshot_step) r->snapshot_step = -1;
    return Action{ActionKind::kFetchCheckpoint, job.id(), "", due};
  }
  const bool timed =
      every == 0 && Now() - r->last_checkpoint_ms >=
                        1000.0 * options_.checkpoint_interval_seconds;
  if (r->snapshot_step == -1 && timed) {
    r->snapshot_step = -2;
    return Action{ActionKind::kRequestSnapshot, job.id(), "", 0};
  }
  return std::nullopt;
}

absl::StatusOr<int64_t> SchedulerCore::RequestSnapshots(
    const std::string& job_id) {
  std::vector<std::string> addresses;
  int64_t step = 0;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(JobRecord * r, jobs_.Find(job_id));
    addresses = r->Addresses();
    step = (r->job.stages_size() > 0 ? r->job.stages(0).next_step() : 0) +
           kSnapshotLead;
  }
  // A stage already past the step refuses it: ask every stage again,
  // further on. Stages that took a lower step keep a snapshot nobody
  // fetches (they hold two at most).
  for (int round = 0; round < kSnapshotRounds; ++round) {
    bool agreed = true;
    for (size_t s = 0; s < addresses.size() && agreed; ++s) {
      absl::StatusOr<int64_t> r =
          control_->Snapshot(addresses[s], job_id, step);
      if (r.ok()) continue;
      if (!absl::IsFailedPrecondition(r.status())) return r.status();
      agreed = false;
      step += kSnapshotLead << round;
    }
    if (agreed) return step;
  }
  return absl::AbortedError("the stages ran ahead of every snapshot step");
}

void SchedulerCore::RequestSnapshotAction(const std::string& job_id) {
  absl::StatusOr<int64_t> step = RequestSnapshots(job_id);
  if (!step.ok())
    PT_LOG(WARNING) << job_id << ": no snapshot: " << step.status();
  absl::MutexLock lock(&mu_);
  JobRecord* r = *jobs_.Find(job_id);
  r->snapshot_step = step.ok() ? *step : -1;
  // A failed request waits a whole interval before the next try.
  if (!step.ok()) r->last_checkpoint_ms = Now();
}

void SchedulerCore::FetchCheckpoint(const std::string& job_id, int64_t step) {
  v1::Plan plan;
  v1::JobSpec spec;
  {
    absl::MutexLock lock(&mu_);
    JobRecord* r = *jobs_.Find(job_id);
    if (r->plan.has_value()) plan = *r->plan;
    spec = r->job.spec();
  }
  // The ledger entries of the steps this checkpoint covers reach the disk
  // before it is committed: a scheduler killed right after the commit
  // leaves no step behind the checkpoint missing from the ledger.
  Flush();
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<v1::CheckpointInfo> info =
      WriteCheckpoint(job_id, plan, spec, step);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (info.ok()) {
    PT_LOG(INFO) << job_id << ": checkpoint " << info->version() << " at step "
                 << step << ", " << info->bytes() << " bytes in " << seconds
                 << " s";
    if (checkpoints_written_ != nullptr) checkpoints_written_->Increment();
    if (checkpoint_bytes_ != nullptr)
      checkpoint_bytes_->Increment(info->bytes());
    if (checkpoint_seconds_ != nullptr) checkpoint_seconds_->Observe(seconds);
  } else {
    PT_LOG(WARNING) << job_id << ": checkpoint at step " << step
                    << " not taken: " << info.status();
  }
  absl::MutexLock lock(&mu_);
  JobRecord* r = *jobs_.Find(job_id);
  r->checkpoint_in_flight = false;
  if (!info.ok()) return;
  r->last_checkpoint_step = std::max(r->last_checkpoint_step, step);
  r->last_checkpoint_ms = Now();
  AddJobEvent(&r->job, v1::JOB_EVENT_CHECKPOINT,
              absl::StrCat("checkpoint ", info->version(), " at step ", step,
                           " (", info->bytes(), " bytes)"),
              Now(), {step, info->version(), seconds});
  jobs_.Save(*r);
}

absl::StatusOr<v1::CheckpointInfo> SchedulerCore::WriteCheckpoint(
    const std::string& job_id, const v1::Plan& plan, const v1::JobSpec& spec,
    int64_t step) {
  if (plan.stages_size() == 0) return absl::FailedPreconditionError("no plan");
  // The committed version: the lowest any stage reached (they agree under
  // the synchronous schedules).
  int64_t version = std::numeric_limits<int64_t>::max();
  int64_t optimizer_steps = 0;
  // Every layer a stage holds, those without state (activations) too: the
  // store commits a version only when each layer's file has landed.
  std::map<int, std::vector<StateTensor>> layers;
  for (const v1::PlannedStage& s : plan.stages()) {
    for (int layer : LayersOfStage(s)) layers[layer];
    RETURN_IF_ERROR(control_->FetchSnapshot(
        s.worker_address(), job_id, step,
        [&](const StageStateInfo& info, StateTensor t) {
          version = std::min(version, info.weight_version);
          optimizer_steps = info.optimizer_steps;
          const std::optional<int> layer = LayerOfStateTensor(t.name);
          if (!layer.has_value() || layers.count(*layer) == 0) {
            return absl::InvalidArgumentError(
                absl::StrCat("stage ", s.stage(), " sent state '", t.name,
                             "', which names none of its layers"));
          }
          layers[*layer].push_back(std::move(t));
          return absl::OkStatus();
        }));
  }
  // Every stage's snapshot is in hand before anything is written: a stage
  // that lost its snapshot costs no disk writes.
  CheckpointStore* store = options_.checkpoints;
  if (version == std::numeric_limits<int64_t>::max()) version = step;
  for (const auto& [layer, tensors] : layers) {
    absl::Status written = store->WriteLayer(job_id, version, step,
                                             optimizer_steps, layer, tensors);
    if (!written.ok()) {
      (void)store->Discard(job_id, version);  // its files go; best effort
      return written;
    }
  }
  ASSIGN_OR_RETURN(
      CheckpointInfo committed,
      store->Commit(job_id, version, step,
                    spec.training().model().layers_size(),
                    ToJson(spec.training()), KeepCheckpoints(spec)));
  return ToProto(committed);
}

absl::StatusOr<v1::ListCheckpointsResponse> SchedulerCore::ListCheckpoints(
    const v1::ListCheckpointsRequest& request) {
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(jobs_.Find(request.job_id()).status());
  }
  v1::ListCheckpointsResponse out;
  if (options_.checkpoints == nullptr) return out;
  ASSIGN_OR_RETURN(std::vector<CheckpointInfo> list,
                   options_.checkpoints->List(request.job_id()));
  // The store lists newest first; the API oldest first.
  for (auto c = list.rbegin(); c != list.rend(); ++c) {
    *out.add_checkpoints() = ToProto(*c);
  }
  return out;
}

absl::Status SchedulerCore::ExportModel(const v1::ExportModelRequest& request,
                                        const ByteSink& sink) {
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(jobs_.Find(request.job_id()).status());
  }
  if (options_.checkpoints == nullptr) {
    return absl::FailedPreconditionError(
        "this scheduler keeps no checkpoints (it has no data directory)");
  }
  int64_t version = request.version();
  if (version == 0) {
    ASSIGN_OR_RETURN(CheckpointInfo latest,
                     options_.checkpoints->Latest(request.job_id()));
    version = latest.version;
  }
  return options_.checkpoints->StreamExport(request.job_id(), version, sink);
}

absl::StatusOr<v1::CheckpointJobResponse> SchedulerCore::CheckpointJob(
    const v1::CheckpointJobRequest& request) {
  if (options_.checkpoints == nullptr) {
    return absl::FailedPreconditionError(
        "this scheduler keeps no checkpoints (it has no data directory)");
  }
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(JobRecord * r, jobs_.Find(request.job_id()));
    if (r->job.state() != v1::JOB_STATE_RUNNING || r->busy ||
        r->resume_step >= 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(request.job_id(), " is not training (",
                       v1::JobState_Name(r->job.state()),
                       "); checkpoints are taken while "
                       "a job runs"));
    }
    if (r->snapshot_step != -1 || r->checkpoint_in_flight) {
      return absl::UnavailableError(absl::StrCat(
          "a checkpoint of ", request.job_id(), " is being taken; try again"));
    }
    r->snapshot_step = -2;
  }
  absl::StatusOr<int64_t> step = RequestSnapshots(request.job_id());
  {
    absl::MutexLock lock(&mu_);
    (*jobs_.Find(request.job_id()))->snapshot_step = step.ok() ? *step : -1;
  }
  wake_.SignalAll();
  RETURN_IF_ERROR(step.status());
  v1::CheckpointJobResponse out;
  out.set_step(*step);
  return out;
}

// The latest committed checkpoint; without one, the state the job started
// from: its init_from, or step 0 and the seeded initialization (every step
// is then trained again).
absl::StatusOr<SchedulerCore::ResumePoint> SchedulerCore::LoadResumePoint(
    const v1::Job& job) {
  ResumePoint out;
  out.source = "the seeded initialization";
  absl::StatusOr<CheckpointInfo> latest =
      options_.checkpoints == nullptr
          ? absl::NotFoundError("no checkpoint store")
          : options_.checkpoints->Latest(job.id());
  if (absl::IsNotFound(latest.status())) {
    if (job.spec().training().init_from().empty()) return out;
    return LoadInitFrom(job.spec());
  }
  RETURN_IF_ERROR(latest.status());
  ASSIGN_OR_RETURN(LoadedCheckpoint loaded,
                   options_.checkpoints->Load(job.id(), latest->version));
  out.step = loaded.info.step;
  out.version = loaded.info.version;
  out.info = {out.step, out.version, loaded.info.optimizer_steps};
  out.state = std::move(loaded.tensors);
  out.source = absl::StrCat("checkpoint ", out.version, " at step ", out.step);
  return out;
}

void SchedulerCore::TakeFinalCheckpoint(const std::string& job_id) {
  CheckpointStore* store = options_.checkpoints;
  std::vector<std::string> addresses;
  int64_t total = 0;
  {
    absl::MutexLock lock(&mu_);
    JobRecord* r = *jobs_.Find(job_id);
    if (r->job.spec().training().checkpoint_every() < 0) return;  // off
    addresses = r->Addresses();
    total = r->job.total_steps();
  }
  if (store == nullptr || total <= 0 || addresses.empty()) return;
  absl::StatusOr<CheckpointInfo> latest = store->Latest(job_id);
  if (latest.ok() && latest->step >= total) return;  // taken before
  // Done stages are idle at the last boundary and snapshot it at once.
  for (const std::string& address : addresses) {
    absl::StatusOr<int64_t> at = control_->Snapshot(address, job_id, total);
    if (!at.ok()) {
      PT_LOG(WARNING) << job_id << ": no final checkpoint: " << address << ": "
                      << at.status();
      return;
    }
  }
  FetchCheckpoint(job_id, total);
}

}  // namespace pipetrain
