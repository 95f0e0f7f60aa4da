// The two ends of a stage-to-stage Exchange stream.
//
// DownstreamStream is the client end a stage opens to its next stage: it
// sends activations (and norm totals) and receives gradients (and norm
// partials). UpstreamStream is the server end: it receives activations and
// sends gradients back. Both queue outgoing frames and keep exactly one
// write and one read in flight; both decode and validate incoming frames
// before delivering whole messages to the stage's mailbox. A stream that
// breaks fails the mailbox, so a stage waiting on its neighbour fails the
// step at once instead of hanging. Both reach the stage through the
// StageHost only (the upstream end looks up its job's executor there; the
// host opens the downstream end through DownstreamStreamOpener).
//
// Both ends encode and expect the stage's wire format (WireFormat: the
// wire dtype and the job's WireCompression). Where gradients are
// quantized, the end that sends them keeps error feedback (GradientFeedback
// below) unless the job disables it. Activations are quantized without any
// state (no per-sample cache): AQ-SGD's scheme of sending the change since
// the sample's activation in the previous epoch is not built.
#ifndef PIPETRAIN_SERVICES_WORKER_STAGE_STREAMS_H_
#define PIPETRAIN_SERVICES_WORKER_STAGE_STREAMS_H_

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "services/wire/frame_codec.h"
#include "worker/pipeline/stage_executor.h"
#include "worker/pipeline/stage_host.h"
#include "worker/pipeline/stage_metrics.h"

namespace pipetrain {

// Outgoing frames of one stream: at most one write in flight. Not
// thread-safe on its own; guarded by its owner's mutex.
struct WriteQueue {
  std::deque<grpc::ByteBuffer> pending;
  grpc::ByteBuffer current;
  bool writing = false;
  // Moves the next frame into `current` when no write is in flight; true
  // when the caller must start writing `current`.
  bool StartNext();
  // Queues `frames`, then StartNext.
  bool Push(std::vector<grpc::ByteBuffer> frames);
  // The write in flight finished (`ok`: it went out), then StartNext; a
  // failed write drops what is pending (false).
  bool WriteDone(bool ok);
};

// Error feedback of one link's quantized gradients: for each model chunk
// and gradient shape, the quantization error of the last gradient message
// the link sent (sent value - what the receiver decodes), which the next
// message of that chunk and shape carries in addition (EF-SGD). Over N
// messages the receiver's sum of decoded gradients then differs from the
// sum of the true ones by one message's error instead of N's. The state
// lives as long as the link: a reconfigured stage (recovery) opens new
// streams and starts from zero, and a message of another shape (a short
// last micro-batch) gets a residual of its own. Not thread-safe; guarded
// by its owner.
class GradientFeedback {
 public:
  // The residual to hand EncodeMessage for `message` (zeros the first
  // time), or null when `format` does not quantize its payload or disables
  // feedback.
  float* ResidualFor(const WireFormat& format, const StageMessage& message);
  // Forgets `message`'s residual (its encoding failed half-way).
  void Drop(const StageMessage& message);

 private:
  using Key = std::pair<int, Shape>;  // chunk, gradient shape
  // Shapes one link may keep residuals for; a stage sends one or two (a
  // short last micro-batch), interleaved ones one per chunk.
  static constexpr size_t kMaxResiduals = 16;
  std::map<Key, std::vector<float>> residuals_;
};

// Client end of an Exchange stream to the next stage. Thread-safe.
class DownstreamStream final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
      public DownstreamLink {
 public:
  // Opens the stream (waiting for the neighbour to come up) and sends
  // HELLO. `executor` receives what comes back.
  static std::shared_ptr<DownstreamStream> Open(
      const std::string& address, std::shared_ptr<StageExecutor> executor,
      StageMetrics* metrics, size_t chunk_bytes);
  ~DownstreamStream() override;

  absl::Status Send(StageMessage message) override;
  // Cancels the stream and waits until gRPC is done with it.
  void Close() override;

  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  DownstreamStream(const std::string& address,
                   std::shared_ptr<StageExecutor> executor,
                   StageMetrics* metrics, size_t chunk_bytes);
  // Queues frames and starts a write when none is in flight; Unavailable
  // once the stream is ending (no write may start from outside a reaction
  // then).
  absl::Status Enqueue(std::vector<grpc::ByteBuffer> frames);
  // The stream is ending (its read failed, a bad frame, Close): no write
  // starts from outside a reaction any more, and the hold that kept gRPC
  // from finishing the call under such a write goes once none is being
  // started.
  void EndOutsideWrites() ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the hold if the stream is ending and no write is being started;
  // true when the caller must call RemoveHold.
  bool TakeHoldLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a send on an ending stream gets.
  absl::Status ClosedError() const;

  // Constant after construction.
  const std::string address_;
  const std::shared_ptr<StageExecutor> executor_;
  StageMetrics* const metrics_;  // borrowed, may be null
  const size_t chunk_bytes_;
  const WireFormat format_;
  grpc::GenericStub stub_;
  grpc::ClientContext context_;

  // Used only by read reactions (one read in flight).
  grpc::ByteBuffer in_;
  FrameAssembler assembler_;

  // Held while a message is encoded.
  absl::Mutex encode_mu_;
  GradientFeedback feedback_ ABSL_GUARDED_BY(encode_mu_);

  absl::Mutex mu_;
  WriteQueue writes_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // OnDone ran
  // Sends (Send, Open's HELLO) may start a write from outside a reaction,
  // so a hold taken before StartCall keeps gRPC from finishing the call
  // until the stream is ending (a read or write failed, a bad frame came
  // back, or Close; nothing is sent after) and no such write is being
  // started.
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  int starting_ ABSL_GUARDED_BY(mu_) = 0;  // writes being started outside
  bool hold_ ABSL_GUARDED_BY(mu_) = true;
};

// Server end of an Exchange stream from the previous stage. Owned by gRPC:
// deletes itself when done.
class UpstreamStream final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // `host` is borrowed and must outlive the stream; frames of at most
  // `chunk_bytes` payload bytes go back up. `peer` (the remote address)
  // names the stream in the logs.
  //
  // What a stream must do before its payload is read: its first frame is
  // a HELLO naming the job the worker runs and the stage before this one,
  // and no other stream is that stage's live upstream (a second one is
  // refused with AlreadyExists; the live one is never displaced). Every
  // frame's header then passes the stage's shape checks before anything
  // is allocated for its message. A rejected frame ends only its stream.
  //
  // A `probe` stream (ProbeExchange) is a message-cost probe instead
  // (MeasureStreamMessageCost): its HELLO has `echo` and names no job, it
  // holds no stage, and each of its messages, one small float32 ACTIVATION
  // at a time with steps 0, 1, 2, ... and at most kMaxEchoBytes of
  // payload, goes through a mailbox to a thread of the stream's own, which
  // sends it back. One such stream at a time per process (a second is
  // refused with ResourceExhausted). A stage stream's HELLO must not have
  // `echo`, nor a probe stream's lack it.
  // `context` (the call's, owned by gRPC; may be null) lets a probe stream
  // that fails while its client reads nothing be cancelled.
  UpstreamStream(StageHost* host, size_t chunk_bytes, std::string peer = "",
                 bool probe = false,
                 grpc::CallbackServerContext* context = nullptr);
  static constexpr int64_t kMaxEchoBytes = 64 << 10;
  // Echoes a probe stream may have waiting to be written (its client reads
  // each before it sends the next); past them the stream is ended, as it
  // is after 5 s without a message.
  static constexpr size_t kMaxEchoPendingFrames = 4;
  // Whether a frame announces what a probe stream carries, either way: one
  // float32 ACTIVATION tensor of at most kMaxEchoBytes.
  static bool IsEchoSized(MessageKind kind, const v1::FrameHeader& header);

  // Queues a message to the upstream stage (called through its StageLink).
  absl::Status Send(StageMessage message);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  class Link;
  class Echo;
  // Ends the stream with `status` once no write is in flight.
  void FinishWith(const grpc::Status& status);
  absl::Status HandleFrame();
  // Gives up the stage's upstream place (idempotent). Read reactions and
  // OnDone only.
  void ReleaseLink();
  // The assembler's header check (runs inside a read reaction).
  absl::Status CheckHeader(MessageKind kind, const v1::FrameHeader& h) const;

  StageHost* const host_;  // borrowed
  const size_t chunk_bytes_;
  const std::string peer_;
  const bool probe_;
  grpc::CallbackServerContext* const context_;  // owned by gRPC, may be null
  // Used only by read reactions.
  grpc::ByteBuffer in_;
  FrameAssembler assembler_;
  std::shared_ptr<StageExecutor> executor_;
  std::shared_ptr<Link> link_;
  std::string job_id_;
  // Set by the HELLO, in a read reaction before any Send (the executor
  // gets the link, and so can send, only then).
  WireFormat format_;
  // A probe stream (an echo HELLO): set before its echo thread starts.
  bool echoing_ = false;
  std::unique_ptr<Echo> echo_;  // read reactions and OnDone only
  int64_t echo_next_step_ = 0;  // read reactions only

  // Held while a message is encoded.
  absl::Mutex encode_mu_;
  GradientFeedback feedback_ ABSL_GUARDED_BY(encode_mu_);

  absl::Mutex mu_;
  WriteQueue writes_ ABSL_GUARDED_BY(mu_);
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> finish_status_ ABSL_GUARDED_BY(mu_);
};

// A StageHost's way to open DownstreamStreams: frames of at most
// `chunk_bytes` payload bytes; `metrics` (borrowed, may be null) counts
// what they send and receive.
DownstreamOpener DownstreamStreamOpener(StageMetrics* metrics,
                                        size_t chunk_bytes);

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_WORKER_STAGE_STREAMS_H_
