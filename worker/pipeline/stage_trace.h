// StageTrace: the pipeline trace of one stage, i.e. which instruction ran
// when, for drawing the schedule's timeline and measuring its bubbles.
//
// The executor appends one small TraceRecord per executed instruction (no
// strings, no protos); records turn into v1::TraceEvent only when someone
// asks. The window is bounded: the last `max_steps` steps, and at most
// `max_events` records, whichever is smaller.
//
// Thread-safe: the training thread records, any thread reads.
#ifndef PIPETRAIN_WORKER_PIPELINE_STAGE_TRACE_H_
#define PIPETRAIN_WORKER_PIPELINE_STAGE_TRACE_H_

#include <cstddef>
#include <cstdint>
#include <deque>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "pipetrain/v1/stage.pb.h"
#include "spec/schedule.h"

namespace pipetrain {

// One executed instruction.
struct TraceRecord {
  // The step whose stream ran it; the event reports the micro-batch's step
  // (step + instruction.step_offset).
  int64_t step = 0;
  Instruction instruction{OpKind::kForward};
  // The weight version in force while it ran (for an optimizer step, the
  // version it updated; for a forward or backward, the version it used).
  int64_t weight_version = 0;
  // Forward and backward: a checksum of the weights it ran with, taken
  // where it ran (0 unless the stage checksums weights).
  uint64_t weight_checksum = 0;
  // Bytes of held weight-gradient operands whose products it ran
  // (TraceEvent.weight_grad_bytes_run).
  int64_t weight_grad_bytes_run = 0;
  // Wall-clock microseconds since the Unix epoch.
  int64_t start_unix_us = 0;
  int64_t end_unix_us = 0;
};

class StageTrace {
 public:
  static constexpr int64_t kDefaultMaxSteps = 64;
  static constexpr size_t kDefaultMaxEvents = 100000;

  explicit StageTrace(int stage, int64_t max_steps = kDefaultMaxSteps,
                      size_t max_events = kDefaultMaxEvents);

  // Appends a record, dropping the oldest ones that fall out of the window.
  // Steps are expected in non-decreasing order.
  void Record(const TraceRecord& record);

  // The records of steps >= since_step still in the window, oldest first.
  v1::GetTraceResponse Since(int64_t since_step) const;

  // Wall-clock microseconds since the Unix epoch.
  static int64_t NowUnixMicros();

 private:
  // Constant after construction.
  const int stage_;
  const int64_t max_steps_;
  const size_t max_events_;

  mutable absl::Mutex mu_;
  std::deque<TraceRecord> records_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_PIPELINE_STAGE_TRACE_H_
