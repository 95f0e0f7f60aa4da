#include "worker/pipeline/stage_trace.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace pipetrain {

StageTrace::StageTrace(int stage, int64_t max_steps, size_t max_events)
    : stage_(stage),
      max_steps_(std::max<int64_t>(1, max_steps)),
      max_events_(std::max<size_t>(1, max_events)) {}

void StageTrace::Record(const TraceRecord& record) {
  absl::MutexLock lock(&mu_);
  records_.push_back(record);
  while (records_.size() > max_events_ ||
         records_.front().step <= record.step - max_steps_) {
    records_.pop_front();
  }
}

v1::GetTraceResponse StageTrace::Since(int64_t since_step) const {
  // Copy the plain records under the lock and build the protos outside
  // it, so a large answer does not hold up the training thread.
  std::vector<TraceRecord> records;
  {
    absl::MutexLock lock(&mu_);
    // Steps ascend: skip the older ones with a binary search.
    auto first = std::partition_point(
        records_.begin(), records_.end(),
        [since_step](const TraceRecord& r) { return r.step < since_step; });
    records.assign(first, records_.end());
  }
  v1::GetTraceResponse out;
  out.mutable_events()->Reserve(static_cast<int>(records.size()));
  for (const TraceRecord& r : records) {
    v1::TraceEvent* e = out.add_events();
    e->set_stage(stage_);
    // The micro-batch's step: a cross-step schedule runs backwards of the
    // previous step's micro-batches in a step's stream.
    e->set_step(r.step + r.instruction.step_offset);
    e->set_op(OpKindShortName(r.instruction.op));
    e->set_micro_batch(r.instruction.micro_batch);
    e->set_chunk(r.instruction.chunk);
    e->set_weight_version(r.weight_version);
    e->set_weight_checksum(r.weight_checksum);
    e->set_weight_grad_bytes_run(r.weight_grad_bytes_run);
    e->set_start_unix_us(r.start_unix_us);
    e->set_end_unix_us(r.end_unix_us);
  }
  return out;
}

int64_t StageTrace::NowUnixMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace pipetrain
