#include "scheduler/elastic_growth.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "scheduler/job_events.h"
#include "scheduler/plan_builder.h"
#include "scheduler/worker_kinds.h"
#include "spec/profile_scale.h"

namespace pipetrain {
namespace {

// A profile measured on `measured` as `reference` would see it (the
// planner takes workers[0] as the reference for speeds): unchanged on a
// worker of the same kind, else scaled by their GEMM speeds (unknown
// speeds count as equal, as there).
v1::ProfileResponse Rescaled(v1::ProfileResponse profile,
                             const v1::WorkerInfo& measured,
                             const v1::WorkerInfo& reference) {
  const double from = measured.gemm_gflops();
  const double to = reference.gemm_gflops();
  if (SameWorkerKind(measured, reference) || from <= 0 || to <= 0) {
    return profile;
  }
  ScaleLayerTimes(from / to, &profile);
  return profile;
}

}  // namespace

absl::StatusOr<GrowthProposal> ProposeGrowth(const GrowthInputs& in) {
  if (in.current.empty() || in.joining.empty()) {
    return absl::InvalidArgumentError(
        "growth needs the job's workers and at least one joining worker");
  }
  PlanInputs now;
  now.job_id = in.job_id;
  now.spec = in.spec;
  now.spec.set_num_stages(in.current_stages);
  now.profile = Rescaled(in.profile, in.joining[0], in.current[0]);
  now.workers = in.current;
  now.topology = in.topology;
  now.message_overhead_seconds = in.message_overhead_seconds;
  now.bubble = in.bubble;
  ASSIGN_OR_RETURN(const v1::Plan current, BuildPlan(now));

  PlanInputs grown = now;
  grown.spec = in.spec;
  grown.profile = in.profile;
  grown.kind_profiles = in.kind_profiles;
  grown.workers = in.joining;
  grown.workers.insert(grown.workers.end(), in.current.begin(),
                       in.current.end());
  // A fixed stage count the job could not meet before may be met now, and
  // never more than there are workers.
  const int n = static_cast<int>(grown.workers.size());
  if (grown.spec.num_stages() > n) grown.spec.set_num_stages(n);
  GrowthProposal out;
  ASSIGN_OR_RETURN(out.plan, BuildPlan(grown));
  out.current_seconds = current.predicted_step_seconds();
  out.proposed_seconds = out.plan.predicted_step_seconds();
  out.worthwhile =
      out.current_seconds > 0 &&
      out.proposed_seconds <= (1.0 - kMinGrowthGain) * out.current_seconds;
  return out;
}

std::string GrowthMessage(const GrowthProposal& proposal, int old_stages) {
  const int k = proposal.plan.stages_size();
  const std::string what =
      k == old_stages
          ? absl::StrCat("moved onto faster workers (", k, " stages)")
          : absl::StrCat("grew from ", old_stages, " to ", k, " stages");
  return absl::StrFormat("%s (predicted step %.4g s -> %.4g s): %s", what,
                         proposal.current_seconds, proposal.proposed_seconds,
                         PlanSummary(proposal.plan));
}

}  // namespace pipetrain
