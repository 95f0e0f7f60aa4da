#include "worker/pipeline/gradient_norm.h"

#include "common/status_macros.h"

namespace pipetrain {
namespace {

StageMessage NormMessage(MessageKind kind, int64_t step, double value) {
  StageMessage msg;
  msg.kind = kind;
  msg.step = step;
  msg.value = value;
  return msg;
}

}  // namespace

absl::StatusOr<double> AllReduceSumSquares(double local, int64_t step,
                                           bool first, bool last,
                                           StagePort* port,
                                           double* idle_seconds) {
  double partial = local;
  if (!last) {
    ASSIGN_OR_RETURN(StageMessage msg, port->Receive(MessageKind::kNormPartial,
                                                     step, 0, 0, idle_seconds));
    partial += msg.value;
  }
  if (!first) {
    RETURN_IF_ERROR(port->SendUpstream(
        NormMessage(MessageKind::kNormPartial, step, partial)));
  }
  double total = partial;
  if (!first) {
    ASSIGN_OR_RETURN(StageMessage msg, port->Receive(MessageKind::kNormTotal,
                                                     step, 0, 0, idle_seconds));
    total = msg.value;
  }
  if (!last) {
    RETURN_IF_ERROR(port->SendDownstream(
        NormMessage(MessageKind::kNormTotal, step, total)));
  }
  return total;
}

}  // namespace pipetrain
