// The model rules the scheduler relies on (SpecModelSupport): validating
// specs and the schedules' theoretical bubbles, from the compute-free spec/
// library. Evaluation runs in the workers' pipeline (StageControl), so this
// process computes nothing.
#ifndef PIPETRAIN_SERVICES_SCHEDULER_SCHEDULER_SUPPORT_H_
#define PIPETRAIN_SERVICES_SCHEDULER_SCHEDULER_SUPPORT_H_

#include "scheduler/interfaces.h"

namespace pipetrain {

// Thread-safe (stateless).
class SpecModelSupport final : public ModelSupport {
 public:
  absl::Status Validate(const v1::TrainingSpec& spec) override;
  double TheoreticalBubble(const v1::JobSpec& spec, int num_stages) override;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_SCHEDULER_SCHEDULER_SUPPORT_H_
