// Validation of a JobSpec on its own, compute-free, and what theory says
// about its schedule. The scheduler checks every submitted job here, and
// pipetrainctl checks a job before sending it; the cluster's state (how
// many workers are alive) is the scheduler's to check.
#ifndef PIPETRAIN_SPEC_JOB_SPEC_H_
#define PIPETRAIN_SPEC_JOB_SPEC_H_

#include <string>

#include "absl/status/statusor.h"
#include "pipetrain/v1/scheduler.pb.h"
#include "spec/schedule.h"

namespace pipetrain {

// Parses a job as users write it (a file for pipetrainctl, a REST body):
// protobuf JSON of a whole JobSpec with a `training` field, or of a bare
// TrainingSpec, wrapped in JobSpec.training. InvalidArgument (with both
// parsers' complaints) when it is neither. Parsing only: ValidateJobSpec
// checks the values.
absl::StatusOr<v1::JobSpec> ParseJobSpecJson(const std::string& json);

// Checks the training spec (spec/training_spec.h); the stage count against
// the model; that the schedule and wire dtype are values this build knows;
// the wire compression's values (spec/vocabulary.h's
// ValidateWireCompression); the schedule's options (vertical_sync only with
// SCHEDULE_ASYNC_1F1B, virtual_stages only with SCHEDULE_INTERLEAVED, whose
// workers need micro-batches divisible by the stage count and enough layers);
// no gradient clipping under the cross-step schedules (a global norm would make
// every update wait for every stage); and, when the stage count is fixed, that
// the schedule can be built (e.g. 2bw needs micro_batches >= num_stages - 1).
// InvalidArgument naming the field.
absl::Status ValidateJobSpec(const v1::JobSpec& spec);

// The job's schedule on `num_stages` stages (>= 1): its kind, K, M and,
// for SCHEDULE_INTERLEAVED, v (virtual_stages, 2 when unset).
// InvalidArgument for an unknown schedule or num_stages < 1.
absl::StatusOr<ScheduleParams> JobScheduleParams(const v1::JobSpec& spec,
                                                 int num_stages);

// The idle fraction the job's schedule has in theory on `num_stages`
// stages with uniform costs, e.g. (K - 1) / (M + K - 1) for GPipe (see
// TheoreticalBubble in spec/schedule.h).
absl::StatusOr<double> JobTheoreticalBubble(const v1::JobSpec& spec,
                                            int num_stages);

}  // namespace pipetrain

#endif  // PIPETRAIN_SPEC_JOB_SPEC_H_
