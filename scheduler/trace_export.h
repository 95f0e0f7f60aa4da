// The pipeline trace as the scheduler exports it: every stage's recent
// instruction events, each read once into a typed TraceSpan (the op as an
// enum, not a string to re-parse), rendered in the Chrome trace event
// format so a user sees the forward/backward blocks per stage and the
// bubbles between them in chrome://tracing or Perfetto.
//
// Pure functions; thread-safe.
#ifndef PIPETRAIN_SCHEDULER_TRACE_EXPORT_H_
#define PIPETRAIN_SCHEDULER_TRACE_EXPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pipetrain/v1/scheduler.pb.h"
#include "pipetrain/v1/stage.pb.h"
#include "spec/schedule.h"

namespace pipetrain {

// The Chrome trace category of an instruction (spec/schedule.h's OpKind,
// whose short names travel in TraceEvent.op): "forward", "backward",
// "backward-input", "backward-weight", "transfer", "loss", "data" or
// "optimizer".
const char* TraceOpCategory(OpKind op);

struct TraceSpan {
  int stage = 0;
  int chunk = 0;
  int64_t step = 0;
  OpKind op = OpKind::kForward;
  int micro_batch = 0;
  int64_t weight_version = 0;
  // Bytes of held weight-gradient operands the instruction ran
  // (TraceEvent.weight_grad_bytes_run).
  int64_t weight_grad_bytes_run = 0;
  int64_t start_unix_us = 0;
  int64_t end_unix_us = 0;
};

// InvalidArgument (naming the stage and the op) for an unknown op.
absl::StatusOr<TraceSpan> SpanFromEvent(const v1::TraceEvent& event);

// The event's name in the trace: the op and its micro-batch ("F3", "SendG0"),
// or "Step" for the optimizer step.
std::string SpanName(const TraceSpan& span);

// {"displayTimeUnit": "ms", "traceEvents": [...]}: one process per planned
// stage (pid = stage, named after its layers and worker), one thread per
// model chunk (tid = chunk), and a complete ("X") event per span with ts
// and dur in microseconds (ts since the Unix epoch) and args step,
// micro_batch, weight_version and, when it ran held weight-gradient
// products, weight_grad_bytes_run. `spans` in any order.
std::string ChromeTraceJson(const v1::Plan& plan,
                            const std::vector<TraceSpan>& spans);

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_TRACE_EXPORT_H_
