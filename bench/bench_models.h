// The models and measurements the benchmarks share.
#ifndef PIPETRAIN_BENCH_BENCH_MODELS_H_
#define PIPETRAIN_BENCH_BENCH_MODELS_H_

#include <cstdint>

#include "pipetrain/v1/job.pb.h"
#include "pipetrain/v1/stage.pb.h"

namespace pipetrain {

// The MLP 784-2048-2048-2048-10 with ReLUs: 7 layers (Linear, ReLU, ...).
inline v1::ModelSpec WideMlpModel() {
  v1::ModelSpec model;
  model.set_input_kind(v1::INPUT_KIND_FLOAT);
  model.add_input_shape(784);
  model.set_loss(v1::LOSS_KIND_SOFTMAX_CROSS_ENTROPY);
  const int widths[] = {784, 2048, 2048, 2048, 10};
  for (int i = 0; i < 4; ++i) {
    auto* linear = model.add_layers()->mutable_linear();
    linear->set_in_features(widths[i]);
    linear->set_out_features(widths[i + 1]);
    if (i < 3) model.add_layers()->mutable_relu();
  }
  return model;
}

// WideMlpModel on synthetic data, batch 256 in M = 8 micro-batches, SGD.
inline v1::TrainingSpec WideMlpJob(int64_t steps) {
  v1::TrainingSpec spec;
  *spec.mutable_model() = WideMlpModel();
  auto* data = spec.mutable_data()->mutable_synthetic();
  data->set_features(784);
  data->set_classes(10);
  data->set_train_samples(8192);
  data->set_eval_samples(256);
  spec.mutable_optimizer()->mutable_sgd()->set_lr(0.01f);
  spec.mutable_optimizer()->mutable_sgd()->set_momentum(0.9f);
  spec.set_batch_size(256);
  spec.set_micro_batches(8);
  spec.set_steps(steps);
  spec.set_seed(1);
  return spec;
}

// Mean seconds of a stage's steps from `warmup_steps` on.
inline double MeanStepSeconds(const v1::GetStatusResponse& status,
                              int64_t warmup_steps) {
  double sum = 0;
  int n = 0;
  for (const auto& r : status.results()) {
    if (r.step() >= warmup_steps) {
      sum += r.seconds();
      ++n;
    }
  }
  return n == 0 ? 0 : sum / n;
}

}  // namespace pipetrain

#endif  // PIPETRAIN_BENCH_BENCH_MODELS_H_
