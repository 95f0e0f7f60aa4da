// FakeStageControl: a scripted StageControl for tests, standing in for a
// cluster of stage workers without processes or network.
//
// Every address is a simulated stage. Configure gives it a job, a stage
// index and a stage count; Train moves its target the way a worker does
// (never below the step in progress, which a running stage always
// finishes); Stop clears it. Advance() moves every training stage toward
// its target, producing step results; Report() builds the StageReport the
// worker's heartbeat would carry (results since the previous report),
// which the test hands to SchedulerCore::Heartbeat. Evaluate behaves like
// the pipeline: a stage's call waits until every stage of the job has been
// called (one-by-one calls would hang, and fail after `evaluate_wait`), a
// stage still training refuses, and the last stage answers with the
// scripted result.
//
// State: a stage holds layers [layer_begin, layer_end) of the model, and its
// state at a step boundary s is, for every layer i it holds, a tensor
// "layers.{i}.weight" of shape [2] holding {i, s} (a synchronous pipeline's
// state is a function of the step). Snapshot and the spec's
// checkpoint_every take snapshots at boundaries (the two most recent are
// kept); FetchSnapshot streams one; a stage configured with
// restore_expected refuses Train until RestoreState gave it every one of
// its layers, with values of the configured start step.
//
// Scripting: FailNext makes the next call of a method to an address fail;
// HoldNext makes it block until Release, so a test can act while a call is
// in flight. Every call is recorded, in order.
//
// Thread-safe.
#ifndef PIPETRAIN_SCHEDULER_FAKE_STAGE_CONTROL_H_
#define PIPETRAIN_SCHEDULER_FAKE_STAGE_CONTROL_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "scheduler/interfaces.h"

namespace pipetrain {

class FakeStageControl final : public StageControl {
 public:
  enum class Method {
    kProfile,
    kConfigure,
    kTrain,
    kStop,
    kEvaluate,
    kGetTrace,
    kSnapshot,
    kFetchSnapshot,
    kRestoreState
  };

  struct Call {
    Method method;
    std::string address;
    std::string job_id;
    // Train: until_step; Evaluate: max_samples; GetTrace: since_step;
    // Snapshot, FetchSnapshot, RestoreState: the step; Profile: the
    // repetitions asked for, negative when the fastest run was.
    int64_t arg = 0;
    v1::StageConfig config;  // Configure only
  };

  // A simulated stage, as tests inspect it.
  struct Stage {
    std::string job_id;  // empty: no stage (never configured, or stopped)
    int stage = 0;
    int num_stages = 0;
    v1::StageState state = v1::STAGE_STATE_IDLE;
    int64_t next_step = 0;
    int64_t until_step = 0;
    std::string error;
    int layer_begin = 0;
    int layer_end = 0;
    // Configured with restore_expected and not yet restored.
    bool awaiting_restore = false;
    // Tensors the last RestoreState loaded (0: none).
    int64_t restored_tensors = 0;
    // Boundaries of the snapshots held, oldest first.
    std::vector<int64_t> snapshots;
    // StageConfig.attempt, echoed in reports.
    int64_t attempt = 0;
  };

  // StageControl.
  absl::StatusOr<v1::ProfileResponse> Profile(
      const std::string& address, const v1::ProfileRequest& request) override;
  absl::StatusOr<v1::ConfigureResponse> Configure(
      const std::string& address, const v1::StageConfig& config) override;
  absl::StatusOr<int64_t> Train(const std::string& address,
                                const std::string& job_id,
                                int64_t until_step) override;
  absl::Status Stop(const std::string& address,
                    const std::string& job_id) override;
  absl::StatusOr<v1::EvalResult> Evaluate(const std::string& address,
                                          const std::string& job_id,
                                          int64_t max_samples) override;
  absl::StatusOr<v1::GetTraceResponse> GetTrace(const std::string& address,
                                                const std::string& job_id,
                                                int64_t since_step) override;
  absl::StatusOr<int64_t> Snapshot(const std::string& address,
                                   const std::string& job_id,
                                   int64_t step) override;
  absl::Status FetchSnapshot(const std::string& address,
                             const std::string& job_id, int64_t step,
                             const StageStateSink& sink) override;
  absl::StatusOr<int64_t> RestoreState(
      const std::string& address, const std::string& job_id,
      const StageStateInfo& info,
      const std::vector<StateTensor>& tensors) override;

  // The state a stage holding `layer` has at boundary `step` (see above).
  static StateTensor LayerState(int layer, int64_t step);

  // Scripting.
  // Stage 0's ConfigureResponse.steps_per_epoch (default 10).
  void SetStepsPerEpoch(int64_t steps);
  // The last stage's evaluation (step: the stage's next step).
  void SetEvalResult(const v1::EvalResult& result);
  // How long an Evaluate call waits for the job's other stages (default 5 s).
  void SetEvaluateWait(std::chrono::milliseconds wait);
  // Profile on `address` reports every layer `factor` times slower than
  // the default 1 ms forward, 2 ms backward.
  void SetProfileSlowdown(const std::string& address, double factor);
  // The next call of `method` to `address` ("" = any) fails with `status`.
  void FailNext(Method method, const std::string& address, absl::Status status);
  // The next call of `method` to `address` ("" = any) blocks until Release.
  void HoldNext(Method method, const std::string& address);
  // True once a call is blocked by HoldNext (false after `timeout`).
  bool WaitUntilHeld(std::chrono::milliseconds timeout);
  // Lets held calls go on; with a non-OK `outcome` they fail with it.
  void Release(absl::Status outcome = absl::OkStatus());
  void SetTrace(const std::string& address, std::vector<v1::TraceEvent> events);

  // Simulated stages.
  // Every stage training toward its target takes up to `steps` steps.
  void Advance(int64_t steps);
  // The stage reports FAILED with `error` from now on.
  void FailStage(const std::string& address, const std::string& error);
  // The worker is gone (killed): every call to it fails Unavailable and its
  // stage neither trains nor reports. Back (empty) with Revive.
  void Kill(const std::string& address);
  void Revive(const std::string& address);
  // A periodic evaluation the stage reports (once) with its next report.
  void AddPeriodicEvaluation(const std::string& address,
                             const v1::EvalResult& eval);
  // The stage's heartbeat report; nullopt while it holds no stage.
  std::optional<v1::StageReport> Report(const std::string& address);
  Stage StageAt(const std::string& address) const;

  std::vector<Call> calls() const;
  std::vector<Call> CallsOf(Method method) const;

 private:
  struct StageSim {
    Stage view;
    // Boundaries asked for by Snapshot, not reached yet.
    std::vector<int64_t> requested;
    int64_t checkpoint_every = 0;
    std::vector<v1::StepResult> unreported;
    std::vector<v1::EvalResult> evaluations;
    std::vector<v1::TraceEvent> trace;
  };
  struct Script {
    Method method;
    std::string address;
    bool hold = false;
    absl::Status status;
  };
  struct EvalBarrier {
    int arrived = 0;
    int64_t generation = 0;
  };

  // Records the call, then applies the first matching script: a failure, or
  // a hold (waits for Release). Returns the status the call must end with.
  absl::Status Enter(Call call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until `num_stages` Evaluate calls of `job_id` have arrived.
  absl::Status AwaitEvaluators(const std::string& job_id, int num_stages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<StageSim*> Holding(const std::string& address,
                                    const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the snapshots due at the stage's current boundary.
  static void TakeSnapshots(StageSim* sim);

  mutable absl::Mutex mu_;
  std::map<std::string, StageSim> stages_ ABSL_GUARDED_BY(mu_);
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<Script> scripts_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, EvalBarrier> barriers_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> killed_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, double> profile_slowdown_ ABSL_GUARDED_BY(mu_);
  int held_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t release_generation_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status release_outcome_ ABSL_GUARDED_BY(mu_);
  int64_t steps_per_epoch_ ABSL_GUARDED_BY(mu_) = 10;
  v1::EvalResult eval_result_ ABSL_GUARDED_BY(mu_);
  std::chrono::milliseconds evaluate_wait_ ABSL_GUARDED_BY(mu_){5000};
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_FAKE_STAGE_CONTROL_H_
