// The model code the scheduler relies on (CpuModelSupport): validating
// specs and evaluating trained weights on the CPU.
#ifndef PIPETRAIN_SERVICES_SCHEDULER_SCHEDULER_SUPPORT_H_
#define PIPETRAIN_SERVICES_SCHEDULER_SCHEDULER_SUPPORT_H_

#include <memory>
#include <mutex>
#include <string>

#include "absl/base/thread_annotations.h"
#include "scheduler/interfaces.h"

namespace pipetrain {

// Validates and predicts with spec/ (compute-free); evaluates on this
// process's CPU.
// Thread-safe (evaluations run one at a time).
class CpuModelSupport final : public ModelSupport {
 public:
  absl::Status Validate(const v1::TrainingSpec& spec) override;
  double TheoreticalBubble(const v1::JobSpec& spec, int num_stages) override;
  absl::StatusOr<v1::EvalResult> Evaluate(
      const v1::TrainingSpec& spec, const std::vector<v1::TensorProto>& weights,
      int64_t max_samples) override;

 private:
  std::mutex mu_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_SCHEDULER_SCHEDULER_SUPPORT_H_
