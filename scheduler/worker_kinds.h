// Worker kinds: the workers the planner treats as the same hardware, and
// the relative speeds it plans with.
//
// Workers of one kind (same device description, measured GEMM speeds
// within kSameKindGemmSpread of the kind's first member) run at exactly the
// same speed in the plan: the spread of a GEMM micro-benchmark between
// processes on one host (several-fold on a busy machine) is noise, and
// planning on it moved jobs between identical workers. Kinds differ in
// speed by a model profile measured on a member of each (its own device,
// the job's real layers: elementwise work, memory-bound updates and launch
// costs included), or, for a kind nobody profiled, by the ratio of its
// first member's GEMM speed to the reference's.
//
// Pure functions; thread-safe.
#ifndef PIPETRAIN_SCHEDULER_WORKER_KINDS_H_
#define PIPETRAIN_SCHEDULER_WORKER_KINDS_H_

#include <map>
#include <string>
#include <vector>

#include "pipetrain/v1/scheduler.pb.h"
#include "pipetrain/v1/stage.pb.h"

namespace pipetrain {

// Two workers with the same device description are one kind while their
// GEMM speeds are within this factor of each other. A CPU quota or another
// processor model is a different kind; the noise of one micro-benchmark
// is not.
inline constexpr double kSameKindGemmSpread = 1.5;

// Whether `a` and `b` are one kind: the same device description and GEMM
// speeds within kSameKindGemmSpread (a worker that measured none, 0, is
// only the kind of others that measured none).
bool SameWorkerKind(const v1::WorkerInfo& a, const v1::WorkerInfo& b);

// The kinds among `workers`, in order of first appearance, each the
// indices of its members (ascending). A worker joins the first kind whose
// first member it is SameWorkerKind with.
std::vector<std::vector<int>> GroupWorkerKinds(
    const std::vector<v1::WorkerInfo>& workers);

// One micro-batch's forward and backward passes through every layer of a
// profile, in seconds.
double ProfiledComputeSeconds(const v1::ProfileResponse& profile);

struct WorkerSpeeds {
  // Per worker of the input, relative to workers[0] (speed 1): a layer
  // takes reference time / speed on it.
  std::vector<double> speed;
  // One line per kind for the plan's explanation, e.g. "kind 2: cpu
  // (openblas, 1 threads) x1 (w2): speed 0.34, profiled on w2".
  std::string explanation;
};

// Speeds for `workers` (non-empty). `reference` was measured on workers[0];
// `profiles` holds profiles measured on other workers (by worker id). A
// kind speeds from a profile of one of its members when there is one, else
// from GEMM speeds (equal when either is unknown). Profiles with no compute
// are ignored.
WorkerSpeeds SpeedsByKind(
    const std::vector<v1::WorkerInfo>& workers,
    const v1::ProfileResponse& reference,
    const std::map<std::string, v1::ProfileResponse>& profiles);

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_WORKER_KINDS_H_
