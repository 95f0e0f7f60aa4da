// Messages between neighbouring stages, and the mailbox a stage receives
// them in. Transport-free: the network edge decodes frames into
// StageMessages and delivers them here; tests connect stages in memory.
#ifndef PIPETRAIN_WORKER_PIPELINE_MAILBOX_H_
#define PIPETRAIN_WORKER_PIPELINE_MAILBOX_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/compute/tensor.h"

namespace pipetrain {

enum class MessageKind {
  kActivation = 0,   // downstream: a micro-batch's output
  kGradient = 1,     // upstream: dL/d(input) of a micro-batch
  kNormPartial = 2,  // upstream: partial sum of squared gradient norms
  kNormTotal = 3,    // downstream: the global sum of squares
  // Downstream: a micro-batch's output in an evaluation pass; forward
  // only, no gradient comes back.
  kEvalActivation = 4,
};

const char* MessageKindName(MessageKind kind);

// One message between neighbouring stages. Activations and gradients carry
// one tensor (tensors[0], the payload, which the network edge may narrow to
// the stage's wire dtype in transit). Labels never travel: the last stage
// reads them itself (stage_data.h).
struct StageMessage {
  MessageKind kind = MessageKind::kActivation;
  // Evaluation activations: the evaluation pass (numbered alike on every
  // stage of a job), not a training step.
  int64_t step = 0;
  int32_t micro_batch = 0;
  // Interleaved: the receiver's model chunk the message is for (else 0).
  int32_t chunk = 0;
  int64_t weight_version = 0;
  // Host float32 tensors.
  std::vector<Tensor> tensors;
  // kNorm* messages: the sum. Activations of the cross-step schedules: how
  // the step ends (StepEnd). Evaluation activations: 1 on the pass's last
  // micro-batch.
  double value = 0.0;
  // Activations (training and evaluation): the number of samples in the
  // split stage 0 reads its inputs from, which the last stage checks
  // against its labels'. 0 in other messages.
  int64_t samples = 0;
};

// Where a stage sends messages for one neighbour. Implementations queue the
// message and return at once; errors mean the link is broken.
// Thread-safe.
class StageLink {
 public:
  virtual ~StageLink() = default;
  virtual absl::Status Send(StageMessage message) = 0;
};

// Incoming messages, keyed by (kind, step, micro-batch, chunk), waited for
// by the stage's executor. Thread-safe.
class Mailbox {
 public:
  // Stores a message for a later Receive. A duplicate key is an error
  // (AlreadyExists); a failed mailbox drops it.
  absl::Status Deliver(StageMessage message);

  // Waits until the message (kind, step, micro_batch, chunk) arrives, the
  // mailbox fails (that status), or the deadline passes (Unavailable naming
  // the message awaited).
  absl::StatusOr<StageMessage> Receive(
      MessageKind kind, int64_t step, int32_t micro_batch, int32_t chunk,
      std::chrono::steady_clock::time_point deadline);

  // Whether Receive of this message would return at once: it is here, or
  // the mailbox has failed.
  bool Ready(MessageKind kind, int64_t step, int32_t micro_batch,
             int32_t chunk) const;
  // Waits until Ready would be true or the deadline passes; returns Ready.
  bool WaitReady(MessageKind kind, int64_t step, int32_t micro_batch,
                 int32_t chunk, std::chrono::steady_clock::time_point deadline);

  // Wakes every waiter with `status` (e.g. a neighbour's stream broke).
  // Later Receives fail with it until Reset.
  void Fail(const absl::Status& status);
  // Drops every stored message and clears a failure.
  void Reset();
  // Drops messages of steps before `step`.
  void DropBefore(int64_t step);
  size_t size() const;

 private:
  using Key = std::tuple<int, int64_t, int32_t, int32_t>;
  // Waits until `key` is here or the mailbox has failed (true), or the
  // deadline passes (false).
  bool AwaitLocked(const Key& key,
                   std::chrono::steady_clock::time_point deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  std::map<Key, StageMessage> messages_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_PIPELINE_MAILBOX_H_
