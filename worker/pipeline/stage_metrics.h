// The Prometheus metrics of a worker's stage. Created once per worker
// process; the executor and the transport update them on their hot paths
// through cached pointers (lock-free).
//
// Names (all prefixed pipetrain_stage_):
//   compute_seconds_total{phase=forward|recompute|backward|weight|loss|
//                               optimizer|pack}  weight: the separate
//                                       weight-gradient pass W of zero-
//                                       bubble schedules (a full backward
//                                       counts as backward); pack: laying
//                                       updated weights out for the GEMM
//                                       while waiting for a neighbour (a
//                                       pass that packs them itself counts
//                                       it in its own phase)
//   idle_seconds_total                  time blocked waiting for neighbours
//   send_seconds_total                  time the training thread spent
//                                       handing messages to the transport
//                                       (encoding and queueing)
//   bytes_total{direction=sent|received, kind=activation|gradient}
//   messages_total{direction, kind}
//   micro_batches_in_flight             forwarded, backward not yet done
//   weight_version                      optimizer steps applied
//   loss                                last step's mean loss (last stage)
//   steps_total, samples_total
//   peak_activation_bytes               last step's peak held activations
//   index                               this worker's stage index
//   theoretical_bubble                  idle fraction the configured
//                                       schedule has in theory (uniform
//                                       costs, backward = 2 x forward)
//   device_memory_bytes{device}         memory the backend holds on its
//                                       device (registered by the worker's
//                                       main(), see Backend::MemoryBytes)
#ifndef PIPETRAIN_WORKER_PIPELINE_STAGE_METRICS_H_
#define PIPETRAIN_WORKER_PIPELINE_STAGE_METRICS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/metrics_registry.h"
#include "worker/pipeline/mailbox.h"

namespace pipetrain {

class StageMetrics {
 public:
  enum Phase {
    kForward = 0,
    kRecompute,
    kBackward,
    kWeight,
    kLoss,
    kOptimizer,
    kPack,
    kPhases
  };
  enum Direction { kSent = 0, kReceived = 1 };

  static absl::StatusOr<std::unique_ptr<StageMetrics>> Create(
      MetricsRegistry* registry);

  Counter* compute_seconds(Phase phase) const { return compute_[phase]; }
  Counter* idle_seconds() const { return idle_; }
  Counter* send_seconds() const { return send_; }
  // Only activation and gradient traffic is counted per kind: evaluation
  // activations count as activations, norm messages as gradients (they
  // travel with them).
  void CountMessage(Direction direction, MessageKind kind, int64_t bytes) const;
  Gauge* in_flight() const { return in_flight_; }
  Gauge* weight_version() const { return weight_version_; }
  Gauge* loss() const { return loss_; }
  Counter* steps() const { return steps_; }
  Counter* samples() const { return samples_; }
  Gauge* peak_activation_bytes() const { return peak_bytes_; }
  Gauge* stage_index() const { return stage_index_; }
  Gauge* theoretical_bubble() const { return theoretical_bubble_; }

 private:
  StageMetrics() = default;
  // Constant after Create; the metrics themselves are thread-safe.
  Counter* compute_[kPhases] = {};
  Counter* idle_ = nullptr;
  Counter* send_ = nullptr;
  Counter* bytes_[2][2] = {};
  Counter* messages_[2][2] = {};
  Gauge* in_flight_ = nullptr;
  Gauge* weight_version_ = nullptr;
  Gauge* loss_ = nullptr;
  Counter* steps_ = nullptr;
  Counter* samples_ = nullptr;
  Gauge* peak_bytes_ = nullptr;
  Gauge* stage_index_ = nullptr;
  Gauge* theoretical_bubble_ = nullptr;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_PIPELINE_STAGE_METRICS_H_
