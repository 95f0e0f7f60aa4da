// Validation of a TrainingSpec's own fields. Every place that accepts a job
// (the scheduler, a stage executor, the in-process trainer) checks specs
// here, so they agree on what a valid job is.
#ifndef PIPETRAIN_WORKER_PIPELINE_TRAINING_SPEC_H_
#define PIPETRAIN_WORKER_PIPELINE_TRAINING_SPEC_H_

#include "absl/status/status.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain {

// Checks a training spec's own fields (batch size, micro-batches, steps or
// epochs, evaluation interval) and its model. InvalidArgument naming the
// field.
absl::Status ValidateTrainingSpec(const v1::TrainingSpec& spec);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_PIPELINE_TRAINING_SPEC_H_
