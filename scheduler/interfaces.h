// What the scheduler's logic needs from the outside world, as interfaces:
// driving stage workers (implemented over gRPC in services/, faked by
// FakeStageControl in tests) and the model rules (spec validation and the
// schedule's bubble, implemented in services/ with the worker's code), so
// scheduler/ depends on neither gRPC nor the compute core. Evaluation runs
// inside the pipeline (StageControl::Evaluate): the scheduler never holds
// weights or computes anything itself.
#ifndef PIPETRAIN_SCHEDULER_INTERFACES_H_
#define PIPETRAIN_SCHEDULER_INTERFACES_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipetrain/v1/scheduler.pb.h"
#include "pipetrain/v1/stage.pb.h"
#include "scheduler/state_tensor.h"

namespace pipetrain {

// Where a stage's state belongs: the step boundary it was captured at, the
// weight version and the optimizer steps taken (Adam's bias correction).
struct StageStateInfo {
  int64_t step = 0;
  int64_t weight_version = 0;
  int64_t optimizer_steps = 0;
};

// Receives a fetched snapshot one tensor at a time, so a stage's state is
// never held twice; a non-OK return ends the fetch with that status.
using StageStateSink =
    std::function<absl::Status(const StageStateInfo& info, StateTensor tensor)>;

// Calls to one stage worker at `address`. Implementations apply deadlines;
// calls block and are made from the scheduler's own threads, never from a
// network reaction. Thread-safe.
class StageControl {
 public:
  virtual ~StageControl() = default;
  virtual absl::StatusOr<v1::ProfileResponse> Profile(
      const std::string& address, const v1::ProfileRequest& request) = 0;
  virtual absl::StatusOr<v1::ConfigureResponse> Configure(
      const std::string& address, const v1::StageConfig& config) = 0;
  // Returns the target in force (see TrainRequest).
  virtual absl::StatusOr<int64_t> Train(const std::string& address,
                                        const std::string& job_id,
                                        int64_t until_step) = 0;
  virtual absl::Status Stop(const std::string& address,
                            const std::string& job_id) = 0;
  // This stage's part of a forward-only pass over the held-out split (see
  // EvaluateStageRequest): every stage of the job must be called at once;
  // each call returns when its stage is done. The last stage's answer holds
  // the result; the others' is empty. Deadlines are sized for an
  // evaluation (minutes).
  virtual absl::StatusOr<v1::EvalResult> Evaluate(const std::string& address,
                                                  const std::string& job_id,
                                                  int64_t max_samples) = 0;
  virtual absl::StatusOr<v1::GetTraceResponse> GetTrace(
      const std::string& address, const std::string& job_id,
      int64_t since_step) = 0;

  // Checkpoints (see SnapshotRequest). Asks the stage to keep a host copy
  // of its state at the boundary before `step`; returns that boundary.
  // FailedPrecondition when the stage is already past `step`.
  virtual absl::StatusOr<int64_t> Snapshot(const std::string& address,
                                           const std::string& job_id,
                                           int64_t step) = 0;
  // Streams the snapshot taken at `step` into `sink`, tensor by tensor
  // (chunks reassembled, each tensor checked complete). NotFound when the
  // stage holds no snapshot of that step.
  virtual absl::Status FetchSnapshot(const std::string& address,
                                     const std::string& job_id, int64_t step,
                                     const StageStateSink& sink) = 0;
  // After Configure with restore_expected, before Train: loads `tensors`
  // (the whole model's state may be given; the stage takes its own
  // layers). Returns the number of tensors the stage loaded.
  virtual absl::StatusOr<int64_t> RestoreState(
      const std::string& address, const std::string& job_id,
      const StageStateInfo& info, const std::vector<StateTensor>& tensors) = 0;
};

// The model rules the scheduler relies on. Thread-safe.
class ModelSupport {
 public:
  virtual ~ModelSupport() = default;
  // InvalidArgument naming the field when the spec cannot train.
  virtual absl::Status Validate(const v1::TrainingSpec& spec) = 0;
  // The idle fraction the job's schedule has in theory on `num_stages`
  // stages with uniform costs (e.g. (K - 1) / (M + K - 1) for GPipe).
  virtual double TheoreticalBubble(const v1::JobSpec& spec, int num_stages) = 0;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_INTERFACES_H_
