#include "services/worker/stage_streams.h"

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "services/rpc/grpc_util.h"

namespace pipetrain {
namespace {

constexpr char kExchangeMethod[] = "/pipetrain.v1.StageService/Exchange";

// Whether this process has a message-cost probe stream open (at most one).
std::atomic<bool> echo_stream_open{false};

// The wire format stage `config` sends and expects.
WireFormat StageWireFormat(const v1::StageConfig& config) {
  WireFormat format;
  format.dtype = config.wire_dtype();
  format.compression = config.wire_compression();
  format.seed = WireSeed(config.job_id(), config.stage());
  return format;
}

int64_t PayloadBytes(const StageExecutor& executor, const StageMessage& m) {
  return WirePayloadBytes(m, StageWireFormat(executor.config()));
}

// Encodes `message` in `format`, with `feedback`'s residual for a
// quantized gradient.
absl::StatusOr<std::vector<grpc::ByteBuffer>> EncodeWithFeedback(
    const std::string& job_id, const StageMessage& message,
    const WireFormat& format, size_t chunk_bytes, GradientFeedback* feedback) {
  float* residual = feedback->ResidualFor(format, message);
  absl::StatusOr<std::vector<grpc::ByteBuffer>> frames =
      EncodeMessage(job_id, message, format, chunk_bytes, residual);
  if (!frames.ok() && residual != nullptr) feedback->Drop(message);
  return frames;
}

// Validates and delivers a decoded message to a stage.
absl::Status DeliverTo(StageExecutor* executor, StageMetrics* metrics,
                       StageMessage message) {
  RETURN_IF_ERROR(executor->ValidateIncoming(message));
  if (metrics != nullptr) {
    metrics->CountMessage(StageMetrics::kReceived, message.kind,
                          PayloadBytes(*executor, message));
  }
  return executor->mailbox()->Deliver(std::move(message));
}

}  // namespace

float* GradientFeedback::ResidualFor(const WireFormat& format,
                                     const StageMessage& message) {
  if (message.kind != MessageKind::kGradient || message.tensors.empty() ||
      message.tensors[0].dtype() != DType::kF32 ||
      format.compression.disable_error_feedback() ||
      PayloadQuantization(format, message.kind) == v1::WIRE_QUANTIZATION_NONE) {
    return nullptr;
  }
  const Tensor& g = message.tensors[0];
  Key key{message.chunk, g.shape()};
  auto it = residuals_.find(key);
  if (it == residuals_.end()) {
    if (residuals_.size() >= kMaxResiduals) residuals_.clear();
    it = residuals_
             .emplace(std::move(key),
                      std::vector<float>(static_cast<size_t>(g.numel()), 0.0f))
             .first;
  }
  return it->second.data();
}

void GradientFeedback::Drop(const StageMessage& message) {
  if (message.tensors.empty()) return;
  residuals_.erase(Key{message.chunk, message.tensors[0].shape()});
}

bool WriteQueue::StartNext() {
  if (writing || pending.empty()) return false;
  current = std::move(pending.front());
  pending.pop_front();
  writing = true;
  return true;
}

bool WriteQueue::Push(std::vector<grpc::ByteBuffer> frames) {
  for (grpc::ByteBuffer& f : frames) pending.push_back(std::move(f));
  return StartNext();
}

bool WriteQueue::WriteDone(bool ok) {
  writing = false;
  if (!ok) {
    pending.clear();
    return false;
  }
  return StartNext();
}

// ---- DownstreamStream ----

DownstreamStream::DownstreamStream(const std::string& address,
                                   std::shared_ptr<StageExecutor> executor,
                                   StageMetrics* metrics, size_t chunk_bytes)
    : address_(address),
      executor_(std::move(executor)),
      metrics_(metrics),
      chunk_bytes_(chunk_bytes),
      format_(StageWireFormat(executor_->config())),
      stub_(CreatePipetrainChannel(address)) {}

std::shared_ptr<DownstreamStream> DownstreamStream::Open(
    const std::string& address, std::shared_ptr<StageExecutor> executor,
    StageMetrics* metrics, size_t chunk_bytes) {
  std::shared_ptr<DownstreamStream> s(
      new DownstreamStream(address, executor, metrics, chunk_bytes));
  // The neighbour may still be starting: wait for it instead of failing.
  s->context_.set_wait_for_ready(true);
  s->assembler_.set_wire_format(s->format_);
  // What comes back is checked against the stage's shapes before a
  // message buffer is taken.
  StageExecutor* checker = executor.get();
  s->assembler_.set_header_check(
      [checker](MessageKind kind, const v1::FrameHeader& h) {
        return checker->ValidateIncomingShape(MessageOutline(kind, h));
      });
  s->stub_.PrepareBidiStreamingCall(&s->context_, kExchangeMethod,
                                    grpc::StubOptions(), s.get());
  std::vector<grpc::ByteBuffer> hello;
  hello.push_back(
      EncodeHello(executor->config().job_id(), executor->config().stage()));
  s->AddHold();  // until the stream ends (EndOutsideWrites)
  s->Enqueue(std::move(hello)).IgnoreError();  // nothing has ended yet
  s->StartRead(&s->in_);
  s->StartCall();
  return s;
}

DownstreamStream::~DownstreamStream() { Close(); }

void DownstreamStream::Close() {
  context_.TryCancel();
  EndOutsideWrites();
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; };
  mu_.Await(absl::Condition(&done));
}

absl::Status DownstreamStream::ClosedError() const {
  return absl::UnavailableError(
      absl::StrCat("the stream to the next stage (", address_, ") is closed"));
}

bool DownstreamStream::TakeHoldLocked() {
  if (!ending_ || starting_ > 0 || !hold_) return false;
  hold_ = false;
  return true;
}

void DownstreamStream::EndOutsideWrites() {
  bool release = false;
  {
    absl::MutexLock lock(&mu_);
    ending_ = true;
    release = TakeHoldLocked();
  }
  if (release) RemoveHold();
}

absl::Status DownstreamStream::Enqueue(std::vector<grpc::ByteBuffer> frames) {
  bool start = false;
  {
    absl::MutexLock lock(&mu_);
    if (ending_) return ClosedError();
    start = writes_.Push(std::move(frames));
    if (start) ++starting_;
  }
  if (!start) return absl::OkStatus();
  // Only this thread may touch `current` until OnWriteDone; the hold keeps
  // the call alive meanwhile.
  StartWrite(&writes_.current);
  bool release = false;
  {
    absl::MutexLock lock(&mu_);
    --starting_;
    release = TakeHoldLocked();
  }
  if (release) RemoveHold();
  return absl::OkStatus();
}

absl::Status DownstreamStream::Send(StageMessage message) {
  {
    absl::MutexLock lock(&mu_);
    if (ending_) return ClosedError();
  }
  if (metrics_ != nullptr) {
    metrics_->CountMessage(StageMetrics::kSent, message.kind,
                           PayloadBytes(*executor_, message));
  }
  std::vector<grpc::ByteBuffer> frames;
  {
    absl::MutexLock lock(&encode_mu_);
    ASSIGN_OR_RETURN(frames,
                     EncodeWithFeedback(executor_->config().job_id(), message,
                                        format_, chunk_bytes_, &feedback_));
  }
  return Enqueue(std::move(frames));
}

void DownstreamStream::OnWriteDone(bool ok) {
  bool start = false;
  bool release = false;
  {
    absl::MutexLock lock(&mu_);
    start = writes_.WriteDone(ok);
    if (!ok) {
      ending_ = true;  // the call is going; nothing more is sent
      release = TakeHoldLocked();
    }
  }
  if (release) RemoveHold();
  if (start) StartWrite(&writes_.current);
}

void DownstreamStream::OnReadDone(bool ok) {
  if (!ok) {
    EndOutsideWrites();  // the stream is ending; OnDone says why
    return;
  }
  absl::StatusOr<DecodedFrame> decoded = assembler_.Add(in_);
  absl::Status status = decoded.status();
  if (status.ok() && decoded->message.has_value()) {
    status = DeliverTo(executor_.get(), metrics_, std::move(*decoded->message));
  }
  if (!status.ok()) {
    PT_LOG(WARNING) << "bad frame from " << address_ << ": " << status;
    executor_->mailbox()->Fail(absl::AbortedError(
        absl::StrCat("bad message from the next stage: ", status.message())));
    context_.TryCancel();
    EndOutsideWrites();  // no read follows
    return;
  }
  StartRead(&in_);
}

void DownstreamStream::OnDone(const grpc::Status& status) {
  absl::Status why = FromGrpcStatus(status);
  if (why.ok())
    why = absl::UnavailableError("the next stage closed the stream");
  if (absl::IsCancelled(why) || absl::IsDeadlineExceeded(why)) {
    why = absl::UnavailableError(why.message());
  }
  executor_->mailbox()->Fail(absl::Status(
      why.code(), absl::StrCat("stream to the next stage (", address_,
                               ") ended: ", why.message())));
  absl::MutexLock lock(&mu_);
  done_ = true;
}

// ---- UpstreamStream ----

// The StageLink the executor holds for sending gradients upstream; it
// outlives the reactor and refuses messages once the reactor is gone.
class UpstreamStream::Link final : public StageLink {
 public:
  explicit Link(UpstreamStream* stream) : stream_(stream) {}
  absl::Status Send(StageMessage message) override {
    absl::MutexLock lock(&mu_);
    if (stream_ == nullptr) {
      return absl::UnavailableError("the previous stage's stream is closed");
    }
    return stream_->Send(std::move(message));
  }
  void Detach() {
    absl::MutexLock lock(&mu_);
    stream_ = nullptr;
  }

 private:
  absl::Mutex mu_;
  UpstreamStream* stream_ ABSL_GUARDED_BY(mu_);
};

// The server end of a message-cost probe: each message goes through a
// mailbox to a thread of its own, which sends it back, as a stage's
// executor takes a message from its mailbox and sends one of its own.
class UpstreamStream::Echo {
 public:
  explicit Echo(UpstreamStream* stream)
      : stream_(stream), thread_([this] { Loop(); }) {}
  ~Echo() {
    mailbox_.Fail(absl::CancelledError("the probe stream ended"));
    thread_.join();
  }
  absl::Status Deliver(StageMessage message) {
    // The client waits for each echo before it sends the next message: a
    // few queued is already a client that does not.
    if (mailbox_.size() >= 4) {
      return absl::ResourceExhaustedError(
          "a probe stream sent messages without waiting for their echoes");
    }
    return mailbox_.Deliver(std::move(message));
  }

 private:
  void Loop() {
    for (int64_t step = 0;; ++step) {
      absl::StatusOr<StageMessage> message =
          mailbox_.Receive(MessageKind::kActivation, step, 0, 0,
                           std::chrono::steady_clock::now() +
                               std::chrono::seconds(kEchoIdleSeconds));
      if (!message.ok()) {
        // An idle probe must not keep the worker's one probe place.
        if (absl::IsUnavailable(message.status())) {
          stream_->FinishWith(
              grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                           absl::StrCat("a probe stream sent nothing for ",
                                        kEchoIdleSeconds, " s")));
        }
        return;
      }
      const absl::Status sent = stream_->Send(*std::move(message));
      if (!sent.ok()) {
        stream_->FinishWith(ToGrpcStatus(sent));  // no-op when finishing
        return;
      }
    }
  }

  // A probe message comes every few milliseconds.
  static constexpr int kEchoIdleSeconds = 5;

  UpstreamStream* const stream_;
  Mailbox mailbox_;
  std::thread thread_;  // last: it uses the members above
};

UpstreamStream::UpstreamStream(StageHost* host, size_t chunk_bytes,
                               std::string peer, bool probe,
                               grpc::CallbackServerContext* context)
    : host_(host),
      chunk_bytes_(chunk_bytes),
      peer_(std::move(peer)),
      probe_(probe),
      context_(context) {
  assembler_.set_header_check(
      [this](MessageKind kind, const v1::FrameHeader& h) {
        return CheckHeader(kind, h);
      });
  StartRead(&in_);
}

bool UpstreamStream::IsEchoSized(MessageKind kind,
                                 const v1::FrameHeader& header) {
  const StageMessage outline = MessageOutline(kind, header);
  return kind == MessageKind::kActivation && outline.tensors.size() == 1 &&
         outline.tensors[0].numel() * 4 <= kMaxEchoBytes;
}

absl::Status UpstreamStream::CheckHeader(MessageKind kind,
                                         const v1::FrameHeader& h) const {
  if (echoing_) {
    if (!IsEchoSized(kind, h) || h.micro_batch() != 0 || h.chunk() != 0 ||
        h.step() != echo_next_step_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a probe stream carries one float32 activation of at most ",
          kMaxEchoBytes, " bytes a message, steps 0, 1, 2, ... in order"));
    }
    return absl::OkStatus();
  }
  if (executor_ == nullptr) {
    return absl::FailedPreconditionError(
        "a stream must start with a HELLO frame naming its job");
  }
  if (h.job_id() != job_id_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frame for job '", h.job_id(), "' on a stream of job '", job_id_, "'"));
  }
  return executor_->ValidateIncomingShape(MessageOutline(kind, h));
}

absl::Status UpstreamStream::Send(StageMessage message) {
  if (!echoing_ && host_->metrics() != nullptr) {
    host_->metrics()->CountMessage(StageMetrics::kSent, message.kind,
                                   WirePayloadBytes(message, format_));
  }
  std::vector<grpc::ByteBuffer> frames;
  {
    absl::MutexLock lock(&encode_mu_);
    ASSIGN_OR_RETURN(frames, EncodeWithFeedback(job_id_, message, format_,
                                                chunk_bytes_, &feedback_));
  }
  bool start = false;
  {
    absl::MutexLock lock(&mu_);
    if (finishing_) {
      return absl::UnavailableError("the previous stage's stream is closed");
    }
    // A probe whose client does not read its echoes must not pile them up.
    if (echoing_ && writes_.pending.size() >= kMaxEchoPendingFrames) {
      return absl::ResourceExhaustedError(
          "a probe stream's client does not read its echoes");
    }
    start = writes_.Push(std::move(frames));
  }
  if (start) StartWrite(&writes_.current);
  return absl::OkStatus();
}

void UpstreamStream::FinishWith(const grpc::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (finishing_) return;
    finishing_ = true;
    writes_.pending.clear();
    if (writes_.writing) {  // OnWriteDone finishes
      finish_status_ = status;
      // A probe ended for not keeping up with its echoes, or for going
      // quiet: a client that reads nothing would keep that write, and the
      // stream, open for good; cancelling fails the write.
      const bool stalled =
          status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
          status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
      if (echoing_ && stalled && context_ != nullptr) context_->TryCancel();
      return;
    }
  }
  Finish(status);
}

void UpstreamStream::OnWriteDone(bool ok) {
  bool start = false;
  std::optional<grpc::Status> finish;
  {
    absl::MutexLock lock(&mu_);
    writes_.writing = false;
    if (!ok && !finishing_) {
      finishing_ = true;
      writes_.pending.clear();
      finish_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                    "write to the previous stage failed");
    }
    if (finishing_) {
      finish.swap(finish_status_);
    } else {
      start = writes_.StartNext();
    }
  }
  if (finish.has_value()) Finish(*finish);
  if (start) StartWrite(&writes_.current);
}

absl::Status UpstreamStream::HandleFrame() {
  ASSIGN_OR_RETURN(DecodedFrame decoded, assembler_.Add(in_));
  const v1::FrameHeader& h = decoded.header;
  if (h.kind() == v1::FRAME_KIND_HELLO) {
    if (executor_ != nullptr || echoing_) {
      return absl::InvalidArgumentError("a second HELLO on one stream");
    }
    if (h.echo() != probe_) {
      return absl::InvalidArgumentError(
          probe_ ? "a ProbeExchange stream must start with an echo HELLO"
                 : "an echo HELLO belongs on ProbeExchange, not Exchange");
    }
    if (probe_) {
      if (!h.job_id().empty()) {
        return absl::InvalidArgumentError("a probe stream names no job");
      }
      bool open = false;
      if (!echo_stream_open.compare_exchange_strong(open, true)) {
        return absl::ResourceExhaustedError(
            "another message-cost probe is running on this worker");
      }
      echoing_ = true;
      echo_ = std::make_unique<Echo>(this);
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(executor_, host_->Executor(h.job_id()));
    const int stage = executor_->config().stage();
    // Interleaved: worker 0's previous stage is the last worker (the
    // wrap-around link from the last virtual stage of one chunk).
    const int previous = executor_->num_chunks() > 1
                             ? (stage + executor_->config().num_stages() - 1) %
                                   executor_->config().num_stages()
                             : stage - 1;
    if (h.stage() != previous) {
      executor_.reset();
      return absl::InvalidArgumentError(absl::StrCat(
          "stage ", h.stage(), " is not the previous stage of stage ", stage));
    }
    // Before the executor has the link (and so may send on it).
    job_id_ = h.job_id();
    format_ = StageWireFormat(executor_->config());
    auto link = std::make_shared<Link>(this);
    if (!executor_->SetUpstreamIfNone(link)) {
      // The live link keeps the job running; the newcomer is the one that
      // cannot be trusted.
      executor_.reset();
      return absl::AlreadyExistsError(
          absl::StrCat("stage ", stage,
                       " already has a live upstream stream; refusing a "
                       "second one"));
    }
    link_ = std::move(link);
    assembler_.set_wire_format(format_);
    return absl::OkStatus();
  }
  // Add ran CheckHeader on this frame: HELLO came first, the job matches.
  if (!decoded.message.has_value()) return absl::OkStatus();
  if (echoing_) {
    ++echo_next_step_;
    return echo_->Deliver(std::move(*decoded.message));
  }
  return DeliverTo(executor_.get(), host_->metrics(),
                   std::move(*decoded.message));
}

void UpstreamStream::ReleaseLink() {
  if (link_ == nullptr) return;
  link_->Detach();
  executor_->ClearUpstream(link_.get());
}

void UpstreamStream::OnReadDone(bool ok) {
  if (!ok) {  // the previous stage closed its side
    ReleaseLink();
    FinishWith(grpc::Status::OK);
    return;
  }
  const absl::Status status = HandleFrame();
  if (!status.ok()) {
    // Before the peer hears the status: a stream it opens next finds the
    // stage's upstream place free.
    ReleaseLink();
    PT_LOG(WARNING) << "rejected a frame from " << peer_
                    << " (ending its stream): " << status;
    FinishWith(ToGrpcStatus(status));
    return;
  }
  StartRead(&in_);
}

void UpstreamStream::OnCancel() {
  if (link_ != nullptr) {  // only the accepted upstream fails the step
    executor_->mailbox()->Fail(
        absl::UnavailableError("the previous stage's stream was cancelled"));
  }
  FinishWith(grpc::Status::CANCELLED);
}

void UpstreamStream::OnDone() {
  ReleaseLink();
  if (echoing_) {
    echo_.reset();  // joins its thread, whose Send now fails
    echo_stream_open = false;
  }
  delete this;
}

DownstreamOpener DownstreamStreamOpener(StageMetrics* metrics,
                                        size_t chunk_bytes) {
  return [metrics, chunk_bytes](const std::string& address,
                                std::shared_ptr<StageExecutor> executor) {
    return DownstreamStream::Open(address, std::move(executor), metrics,
                                  chunk_bytes);
  };
}

}  // namespace pipetrain
