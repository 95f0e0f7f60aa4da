// Validation of a TrainingSpec on its own, compute-free: the scheduler, the
// CLI, the REST gateway (through the scheduler) and the worker accept the
// same specs because they all check them here.
#ifndef PIPETRAIN_SPEC_TRAINING_SPEC_H_
#define PIPETRAIN_SPEC_TRAINING_SPEC_H_

#include "absl/status/status.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain {

// Checks a training spec's own fields (batch size, micro-batches, steps or
// epochs, evaluation interval) and its model (spec/model_spec.h).
// InvalidArgument naming the field. What needs the data or the compute
// core (the dataset's size and sample shape, the optimizer's settings) is
// checked where those are opened.
absl::Status ValidateTrainingSpec(const v1::TrainingSpec& spec);

}  // namespace pipetrain

#endif  // PIPETRAIN_SPEC_TRAINING_SPEC_H_
