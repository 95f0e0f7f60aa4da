// What the scheduler asks of a job's stages, over StageControl: launching a
// plan, pausing, resuming, stopping, evaluating and collecting traces.
// Each function blocks on worker calls (with the deadlines StageControl
// applies); call them without holding locks that network handlers take.
//
// Stateless functions; thread-safe as far as `control` is.
#ifndef PIPETRAIN_SCHEDULER_STAGE_DRIVER_H_
#define PIPETRAIN_SCHEDULER_STAGE_DRIVER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipetrain/v1/scheduler.pb.h"
#include "pipetrain/v1/stage.pb.h"
#include "scheduler/interfaces.h"

namespace pipetrain {

// The configuration of every stage of `plan`, stage order. Interleaved
// stages carry their chunks and link to the next worker around the ring
// (the last worker's downstream is the first).
std::vector<v1::StageConfig> StageConfigs(const std::string& job_id,
                                          const v1::JobSpec& spec,
                                          const v1::Plan& plan,
                                          double recv_timeout_seconds);

// The steps a job trains: spec.steps, or epochs times stage 0's
// steps_per_epoch.
int64_t TotalSteps(const v1::TrainingSpec& spec, int64_t steps_per_epoch);

// Where a launch starts: step 0 with the seeded initialization, or a
// saved state (a checkpoint, or an initFrom file) at its step.
struct StageStart {
  int64_t step = 0;
  // Restored into every stage (its own layers) when set; borrowed.
  const std::vector<StateTensor>* state = nullptr;
  StageStateInfo info;
  // StageConfig.attempt: Job.attempt, the job's relaunches so far.
  int64_t attempt = 0;
  // False: configure (and restore) only; the stages wait for Train (a
  // paused job recovered stays paused).
  bool train = true;
};

// Configures every stage, last first (so each downstream listens before its
// upstream dials) with start_step = start.step; with a state, every stage
// expects a restore and gets its layers' tensors; then (when start.train)
// starts them training until the total, last first. Returns the total steps;
// the first failing call's error, naming the stage (and, when
// failed_stage is given, its index there).
absl::StatusOr<int64_t> LaunchStages(
    StageControl* control, const std::string& job_id, const v1::JobSpec& spec,
    const v1::Plan& plan, double recv_timeout_seconds,
    const StageStart& start = {}, int* failed_stage = nullptr);

// Pauses at a step boundary: stage 0 answers the step after the one it is
// in, a target every later stage can still reach, and the others get it.
// Returns that step.
absl::StatusOr<int64_t> PauseStages(StageControl* control,
                                    const std::vector<std::string>& addresses,
                                    const std::string& job_id);

// Moves every stage's target back to `total_steps`, last first.
absl::Status ResumeStages(StageControl* control,
                          const std::vector<std::string>& addresses,
                          const std::string& job_id, int64_t total_steps);

// Stops the job on every address; a stage that is gone (Unavailable,
// NotFound) counts as stopped. Best effort: other errors are logged.
void StopStages(StageControl* control,
                const std::vector<std::string>& addresses,
                const std::string& job_id);

// Evaluation through the pipeline: calls Evaluate on every stage at once
// (stage 0 feeds the data, each stage waits for its upstream) and returns
// the last stage's result. Any stage's failure fails it, naming every
// failed stage (the code is the first failed stage's).
absl::StatusOr<v1::EvalResult> EvaluateStages(
    StageControl* control, const std::vector<std::string>& addresses,
    const std::string& job_id, int64_t max_samples);

// Every planned stage's trace events of steps >= since_step.
absl::StatusOr<std::vector<v1::TraceEvent>> CollectTraces(
    StageControl* control, const v1::Plan& plan, const std::string& job_id,
    int64_t since_step);

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_STAGE_DRIVER_H_
