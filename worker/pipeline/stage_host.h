// StageHost: what a stage worker process hosts, transport-free.
//
// A worker hosts one stage at a time. The host owns the worker's backend and
// the current StageExecutor, and answers the worker's control calls on them
// (configure or replace the stage, train, stop, status and reports, weights,
// trace, evaluate, profile). The network edge (services/worker/) turns gRPC
// calls into host calls and streams into executor messages; it hands the
// host a DownstreamOpener so the host can link a training stage to the next
// one without knowing the transport. Like TensorFlow's Worker beside
// rpc/GrpcWorkerService.
//
// Thread-safe. Configure, Weights, Evaluate and Profile block (building a
// model, waiting for a step, running the data through); callers on a
// network thread hand them to a thread of their own.
#ifndef PIPETRAIN_WORKER_PIPELINE_STAGE_HOST_H_
#define PIPETRAIN_WORKER_PIPELINE_STAGE_HOST_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "pipetrain/v1/scheduler.pb.h"
#include "pipetrain/v1/stage.pb.h"
#include "worker/compute/backend.h"
#include "worker/pipeline/mailbox.h"
#include "worker/pipeline/stage_executor.h"
#include "worker/pipeline/stage_metrics.h"
#include "worker/pipeline/stage_snapshot.h"
#include "worker/pipeline/state_stream.h"

namespace pipetrain {

// The link from a stage to the next one, which also carries what comes
// back (gradients, norm partials) to the stage's executor. Thread-safe.
class DownstreamLink : public StageLink {
 public:
  // Ends the link and waits until the transport is done with it; later
  // Sends fail with Unavailable.
  virtual void Close() = 0;
};

// Opens the link from `executor`'s stage to the next stage at `address`.
// Must return at once (the neighbour may still be starting: the link waits
// for it). Never null.
using DownstreamOpener = std::function<std::shared_ptr<DownstreamLink>(
    const std::string& address, std::shared_ptr<StageExecutor> executor)>;

class StageHost {
 public:
  // `backend` is owned by the host; `metrics` (borrowed, may be null)
  // receives the stage's metrics. `open_downstream` links a stage that
  // needs a next stage when it starts training or evaluating; without one
  // (a host of single stages, as in tests) such stages fail with
  // FailedPrecondition. `compute_share` (in (0, 1]) is the share of the
  // backend's full speed a sustained computation gets here (a cgroup CPU
  // quota, CpuShareOf): profiles, short enough to run at full speed, are
  // reported as that slower.
  StageHost(std::unique_ptr<Backend> backend, StageMetrics* metrics,
            DownstreamOpener open_downstream = nullptr,
            double compute_share = 1.0);
  ~StageHost();
  StageHost(const StageHost&) = delete;
  StageHost& operator=(const StageHost&) = delete;

  // Stops the current stage, if any, and closes its downstream link.
  void Shutdown();

  // Replaces the current stage (stopping it) with one built from `config`;
  // what the stage looks like on success. A config that fails
  // ValidateStageConfig (InvalidArgument naming the field, or the data
  // policy's error) is refused with the current stage untouched; one that
  // fails later, while building, leaves the worker with no stage.
  absl::StatusOr<v1::ConfigureResponse> Configure(
      const v1::StageConfig& config);
  // Trains job `job_id`'s stage until `until_step` (see
  // StageExecutor::Train), opening its downstream link first when it needs
  // one; returns the target in force.
  absl::StatusOr<int64_t> Train(const std::string& job_id, int64_t until_step);
  // Stops and forgets job `job_id`'s stage.
  absl::Status Stop(const std::string& job_id);
  absl::StatusOr<v1::GetStatusResponse> Status(const std::string& job_id,
                                               int64_t results_since) const;
  // The current stage's status with the step results from `results_since`
  // on, for the heartbeat to the scheduler; nullopt without a stage.
  std::optional<v1::StageReport> Report(int64_t results_since) const;
  // Waits for the step in progress, then copies the stage's weights.
  absl::StatusOr<v1::GetWeightsResponse> Weights(const std::string& job_id);
  // The stage's pipeline trace from `since_step` on (cheap: a bounded copy).
  absl::StatusOr<v1::GetTraceResponse> Trace(const std::string& job_id,
                                             int64_t since_step) const;
  // This stage's part of a forward-only pass of the held-out split (at most
  // `max_samples`, 0 = all) at the current weights; the last stage's
  // response carries the loss and accuracy. Opens the downstream link like
  // Train.
  absl::StatusOr<v1::EvaluateStageResponse> Evaluate(const std::string& job_id,
                                                     int64_t max_samples);
  // Checkpoints. Asks job `job_id`'s stage for a snapshot at the boundary
  // before `step` (StageExecutor::Snapshot); may wait for an evaluation in
  // progress.
  absl::StatusOr<int64_t> Snapshot(const std::string& job_id, int64_t step);
  // The stage's snapshot of that boundary (NotFound when none is held).
  absl::StatusOr<std::shared_ptr<const StageStateSnapshot>> FetchSnapshot(
      const std::string& job_id, int64_t step) const;
  // A RestoreState stream's reassembler, checking chunks against job
  // `job_id`'s stage (cheap: for a stream's first chunk).
  absl::StatusOr<std::unique_ptr<StateAssembler>> StartRestore(
      const std::string& job_id) const;
  // Loads a reassembled state into job `job_id`'s stage
  // (StageExecutor::RestoreState) and says how many of its tensors it
  // loaded. An empty `job_id` (a stream without any chunk) means the
  // current stage, which accepts an empty state only when it holds no
  // parameters. Waits for the stage's compute.
  absl::StatusOr<v1::RestoreStateResponse> RestoreState(
      const std::string& job_id, const TrainingState& state);

  // Times the request's model layer by layer on this worker's backend.
  // FailedPrecondition while a stage trains (the timings would be wrong and
  // would slow the step).
  absl::StatusOr<v1::ProfileResponse> Profile(
      const v1::ProfileRequest& request);

  // The executor of `job_id`: FailedPrecondition without a stage, NotFound
  // when the worker runs another job. For the upstream end of a stream,
  // which delivers its messages to the executor directly.
  absl::StatusOr<std::shared_ptr<StageExecutor>> Executor(
      const std::string& job_id) const;
  // The identity the current stage accepts an Exchange stream from
  // (StageConfig.upstream_identity); empty without a stage or upstream.
  std::string UpstreamIdentity() const;
  StageMetrics* metrics() const { return metrics_; }
  const Backend& backend() const { return *backend_; }

 private:
  // Opens `executor`'s downstream link unless it needs none or has one.
  absl::Status EnsureDownstream(const std::shared_ptr<StageExecutor>& executor);
  // Stops the current stage, if any, and forgets it.
  void DropCurrent();

  // Constant after construction.
  const std::unique_ptr<Backend> backend_;
  StageMetrics* const metrics_;  // borrowed, may be null
  const DownstreamOpener open_downstream_;
  const double compute_share_;

  mutable absl::Mutex mu_;
  std::shared_ptr<StageExecutor> executor_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<DownstreamLink> downstream_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_PIPELINE_STAGE_HOST_H_
