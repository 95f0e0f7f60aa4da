// Elastic growth: whether a running job should take in workers that joined
// since it was planned (a job re-planned onto fewer stages after a loss, or
// one a faster set of workers would run quicker), and the plan it would run
// on. The planner predicts both step times from one profile, so the
// comparison is like for like; the job grows only when the new plan's
// predicted step time is at least kMinGrowthGain lower. The action that
// re-configures the job from its latest checkpoint is in job_growth.cc.
//
// Pure functions; thread-safe.
#ifndef PIPETRAIN_SCHEDULER_ELASTIC_GROWTH_H_
#define PIPETRAIN_SCHEDULER_ELASTIC_GROWTH_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipetrain/v1/scheduler.pb.h"
#include "pipetrain/v1/stage.pb.h"
#include "scheduler/planner.h"

namespace pipetrain {

// The fraction by which the predicted step time must drop for a job to be
// re-configured: a growth costs a stop, a reload and the steps since the
// checkpoint, which a small predicted gain would not pay back.
inline constexpr double kMinGrowthGain = 0.2;

struct GrowthInputs {
  std::string job_id;
  v1::JobSpec spec;
  // The workers the job runs on now, in stage order, and how many stages.
  std::vector<v1::WorkerInfo> current;
  int current_stages = 0;
  // Idle workers that match the job's selector; at least one. The profile
  // was measured on joining[0].
  std::vector<v1::WorkerInfo> joining;
  v1::ProfileResponse profile;
  // Profiles measured on other joining workers, one per other kind
  // (PlanInputs::kind_profiles).
  std::map<std::string, v1::ProfileResponse> kind_profiles;
  Topology topology;
  // PlanInputs::message_overhead_seconds.
  double message_overhead_seconds = -1.0;
  // The schedule's idle fraction on K workers (ModelSupport).
  std::function<double(int num_stages)> bubble;
};

struct GrowthProposal {
  // The plan over the current and the joining workers.
  v1::Plan plan;
  // Predicted step seconds: the planner's best on the current workers with
  // the current stage count, and of `plan`.
  double current_seconds = 0;
  double proposed_seconds = 0;
  // proposed_seconds <= (1 - kMinGrowthGain) * current_seconds.
  bool worthwhile = false;
};

// Plans the job on the current workers and on all of them, from the one
// profile (rescaled to the first current worker's speed for the former).
// The planner's errors pass through (nothing fits, bad profile).
absl::StatusOr<GrowthProposal> ProposeGrowth(const GrowthInputs& inputs);

// The event's text: "grew from 2 to 3 stages (predicted step 0.045 s ->
// 0.030 s): <plan summary>", or "moved onto faster workers" when the stage
// count stays.
std::string GrowthMessage(const GrowthProposal& proposal, int old_stages);

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_ELASTIC_GROWTH_H_
