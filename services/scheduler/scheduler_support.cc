#include "services/scheduler/scheduler_support.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "spec/job_spec.h"
#include "spec/training_spec.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/pipeline/local_trainer.h"

namespace pipetrain {

absl::Status CpuModelSupport::Validate(const v1::TrainingSpec& spec) {
  return ValidateTrainingSpec(spec);
}

double CpuModelSupport::TheoreticalBubble(const v1::JobSpec& spec,
                                          int num_stages) {
  const absl::StatusOr<double> bubble =
      JobTheoreticalBubble(spec, std::max(1, num_stages));
  if (bubble.ok()) return *bubble;
  // Only an unknown schedule gets here, and its stages refuse to train; the
  // bubble is only reported, so log it rather than fail here.
  PT_LOG(ERROR) << "theoretical bubble of an accepted job: " << bubble.status();
  return 0.0;
}

absl::StatusOr<v1::EvalResult> CpuModelSupport::Evaluate(
    const v1::TrainingSpec& spec, const std::vector<v1::TensorProto>& weights,
    int64_t max_samples) {
  std::lock_guard<std::mutex> lock(mu_);
  auto backend = CreateCpuBackend(0);
  ASSIGN_OR_RETURN(std::unique_ptr<LocalTrainer> trainer,
                   LocalTrainer::Create(spec, backend.get()));
  std::vector<Tensor> host;
  for (const v1::TensorProto& t : weights) {
    const Shape shape(t.shape().begin(), t.shape().end());
    if (t.dtype() != v1::DTYPE_F32 ||
        t.data().size() != NumElements(shape) * sizeof(float)) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights of ", t.name(), " are not float32 of shape ",
                       ShapeToString(shape)));
    }
    Tensor tensor = Tensor::Host(shape);
    std::copy(t.data().begin(), t.data().end(),
              static_cast<char*>(tensor.raw()));
    host.push_back(tensor);
  }
  RETURN_IF_ERROR(trainer->model()->LoadParams(host));
  ASSIGN_OR_RETURN(EvalReport report, trainer->Evaluate(max_samples));
  v1::EvalResult out;
  out.set_loss(report.loss);
  out.set_accuracy(report.accuracy);
  out.set_samples(report.samples);
  return out;
}

}  // namespace pipetrain
