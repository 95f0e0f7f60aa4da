#include "worker/pipeline/stage_metrics.h"

#include "common/status_macros.h"

namespace pipetrain {

absl::StatusOr<std::unique_ptr<StageMetrics>> StageMetrics::Create(
    MetricsRegistry* r) {
  std::unique_ptr<StageMetrics> m(new StageMetrics());
  const char* phases[kPhases] = {"forward", "recompute", "backward", "weight",
                                 "loss",    "optimizer", "pack"};
  for (int p = 0; p < kPhases; ++p) {
    ASSIGN_OR_RETURN(m->compute_[p],
                     r->GetCounter("pipetrain_stage_compute_seconds_total",
                                   "Compute time of this stage by phase.",
                                   {{"phase", phases[p]}}));
  }
  ASSIGN_OR_RETURN(m->idle_,
                   r->GetCounter("pipetrain_stage_idle_seconds_total",
                                 "Time the stage waited for its neighbours "
                                 "(pipeline bubble and transfer)."));
  ASSIGN_OR_RETURN(m->send_,
                   r->GetCounter("pipetrain_stage_send_seconds_total",
                                 "Time the training thread spent handing "
                                 "messages to the transport (encoding and "
                                 "queueing)."));
  const char* directions[2] = {"sent", "received"};
  const char* kinds[2] = {"activation", "gradient"};
  for (int d = 0; d < 2; ++d) {
    for (int k = 0; k < 2; ++k) {
      const Labels labels = {{"direction", directions[d]}, {"kind", kinds[k]}};
      ASSIGN_OR_RETURN(
          m->bytes_[d][k],
          r->GetCounter("pipetrain_stage_bytes_total",
                        "Payload bytes on the pipeline edges.", labels));
      ASSIGN_OR_RETURN(
          m->messages_[d][k],
          r->GetCounter("pipetrain_stage_messages_total",
                        "Messages on the pipeline edges.", labels));
    }
  }
  ASSIGN_OR_RETURN(m->in_flight_,
                   r->GetGauge("pipetrain_stage_micro_batches_in_flight",
                               "Micro-batches forwarded whose backward has "
                               "not finished."));
  ASSIGN_OR_RETURN(m->weight_version_,
                   r->GetGauge("pipetrain_stage_weight_version",
                               "Optimizer steps applied to this stage."));
  ASSIGN_OR_RETURN(m->loss_, r->GetGauge("pipetrain_stage_loss",
                                         "Mean loss of the last step (last "
                                         "stage only)."));
  ASSIGN_OR_RETURN(m->steps_, r->GetCounter("pipetrain_stage_steps_total",
                                            "Training steps completed."));
  ASSIGN_OR_RETURN(m->samples_, r->GetCounter("pipetrain_stage_samples_total",
                                              "Samples this stage processed."));
  ASSIGN_OR_RETURN(m->peak_bytes_,
                   r->GetGauge("pipetrain_stage_peak_activation_bytes",
                               "Peak activation memory held in the last "
                               "step."));
  ASSIGN_OR_RETURN(m->stage_index_,
                   r->GetGauge("pipetrain_stage_index",
                               "Index of the stage this worker runs (-1: "
                               "none)."));
  m->stage_index_->Set(-1);
  ASSIGN_OR_RETURN(m->theoretical_bubble_,
                   r->GetGauge("pipetrain_stage_theoretical_bubble",
                               "Idle (bubble) fraction of a step that the "
                               "configured schedule has in theory, from the "
                               "schedule simulator with uniform stage costs "
                               "(0 while no stage is configured)."));
  return m;
}

void StageMetrics::CountMessage(Direction direction, MessageKind kind,
                                int64_t bytes) const {
  // Evaluation activations flow down the same edge as activations.
  const bool down =
      kind == MessageKind::kActivation || kind == MessageKind::kEvalActivation;
  const int k = down ? 0 : 1;
  bytes_[direction][k]->Increment(static_cast<double>(bytes));
  messages_[direction][k]->Increment();
}

}  // namespace pipetrain
