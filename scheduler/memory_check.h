// Whether a job can fit the workers at all, decided before any worker is
// asked to profile it (profiling allocates the job's activations): the
// job's least memory need (spec/size_limits.h) against what the candidate
// workers report together. Pure; thread-safe.
#ifndef PIPETRAIN_SCHEDULER_MEMORY_CHECK_H_
#define PIPETRAIN_SCHEDULER_MEMORY_CHECK_H_

#include <vector>

#include "absl/status/status.h"
#include "pipetrain/v1/job.pb.h"
#include "pipetrain/v1/scheduler.pb.h"

namespace pipetrain {

// FailedPrecondition with the numbers when the spec's footprint exceeds
// the memory `workers` report together. A worker that reports no memory
// (0: unknown) makes the sum unbounded, and a spec whose footprint cannot
// be estimated (validity is ModelSupport's to judge, at submit) is left to
// the planner too.
absl::Status CheckJobFitsWorkers(const v1::TrainingSpec& spec,
                                 const std::vector<v1::WorkerInfo>& workers);

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_MEMORY_CHECK_H_
