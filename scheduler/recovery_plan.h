// The pure parts of recovering a job from a lost worker (the actions are in
// job_recovery.cc): which planned stages lost their worker, the plan with
// spares in their places, the restarts a job may still take, and which
// tensors of a checkpoint a stage needs, and the layers a stage holds.
//
// Pure functions; thread-safe.
#ifndef PIPETRAIN_SCHEDULER_RECOVERY_PLAN_H_
#define PIPETRAIN_SCHEDULER_RECOVERY_PLAN_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/v1/scheduler.pb.h"
#include "pipetrain/v1/stage.pb.h"
#include "scheduler/interfaces.h"
#include "scheduler/state_tensor.h"

namespace pipetrain {

// Recoveries a job may take: spec.max_restarts, 0 meaning 10, -1 none.
int MaxRestarts(const v1::JobSpec& spec);

// Stages of `plan` whose worker can no longer run job `job_id`: unknown,
// LOST, or registered anew (no longer assigned to the job). `workers` by id.
std::vector<int> LostStages(
    const v1::Plan& plan, const std::map<std::string, v1::WorkerInfo>& workers,
    const std::string& job_id);

// Whether a relaunch that could not reach worker `id` at `since_ms` may be
// tried again: the registry has settled it, either LOST (or gone; the
// repair replaces it) or heard from after `since_ms` (alive: try it again).
bool UnreachableWorkerSettled(
    const std::map<std::string, v1::WorkerInfo>& workers, const std::string& id,
    int64_t since_ms);

// `plan` with the worker of each stage in `lost` replaced by the next of
// `spares` (same layers, same order); nullopt when spares are too few.
std::optional<v1::Plan> WithSpares(const v1::Plan& plan,
                                   const std::vector<int>& lost,
                                   const std::vector<v1::WorkerInfo>& spares);

// The model layers stage `stage` of `plan` holds, ascending.
std::vector<int> LayersOfStage(const v1::PlannedStage& stage);

// The tensors of `all` that belong to the layers `config` holds
// ([layer_begin, layer_end), or its chunks).
std::vector<StateTensor> StateForStage(const std::vector<StateTensor>& all,
                                       const v1::StageConfig& config);

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_RECOVERY_PLAN_H_
