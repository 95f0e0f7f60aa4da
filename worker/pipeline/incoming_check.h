// IncomingCheck: what a stage accepts from its neighbours, derived once
// from its config: which kinds of message each model chunk takes and the
// float32 tensor each carries (an activation or a gradient; labels never
// travel). The network edge calls it before anything
// reaches the mailbox, so a malformed message ends only its stream.
//
// Immutable and thread-safe.
#ifndef PIPETRAIN_WORKER_PIPELINE_INCOMING_CHECK_H_
#define PIPETRAIN_WORKER_PIPELINE_INCOMING_CHECK_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "worker/pipeline/mailbox.h"
#include "worker/pipeline/stage_config.h"

namespace pipetrain {

// Numbers [low, high) a message's step may take.
struct StepWindow {
  int64_t low = 0;
  int64_t high = 0;
};

class IncomingCheck {
 public:
  // `chunk_inputs` / `chunk_outputs`: each model chunk's per-sample input
  // and output shape, in chunk order. `first` / `last`: the stage's place.
  IncomingCheck(const StageSetup& setup, bool first, bool last,
                std::vector<Shape> chunk_inputs,
                std::vector<Shape> chunk_outputs);

  // InvalidArgument saying what is wrong with `msg`. Training messages'
  // steps must lie in `steps`, evaluation activations' passes in `passes`.
  absl::Status Check(const StageMessage& msg, StepWindow steps,
                     StepWindow passes) const;

 private:
  absl::Status CheckActivation(const StageMessage& msg, int64_t rows) const;
  absl::Status CheckGradient(const StageMessage& msg) const;
  bool IsFirstVirtual(int chunk) const { return first_ && chunk == 0; }
  bool IsLastVirtual(int chunk) const {
    return last_ && chunk == static_cast<int>(chunk_inputs_.size()) - 1;
  }

  const int64_t micro_batches_;
  const int64_t rows_;  // per micro-batch
  const bool first_;
  const bool last_;
  const std::vector<Shape> chunk_inputs_;
  const std::vector<Shape> chunk_outputs_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_PIPELINE_INCOMING_CHECK_H_
