#include "services/worker/stream_probe.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/elapsed.h"
#include "common/median.h"
#include "common/status_macros.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "services/rpc/grpc_util.h"
#include "services/wire/frame_codec.h"
#include "services/worker/stage_streams.h"
#include "worker/pipeline/mailbox.h"

namespace pipetrain {
namespace {

constexpr char kProbeMethod[] = "/pipetrain.v1.StageService/ProbeExchange";
constexpr int kCpuBatch = 10;

// The client end of a probe stream: frames out through a write queue with
// one write in flight, echoes decoded into a mailbox, as DownstreamStream
// does for a stage. A hold keeps the call alive until Close, so a write
// after the server has ended the stream fails instead of touching a call
// gRPC has freed. Thread-safe.
class ProbeStream final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit ProbeStream(const std::string& address)
      : stub_(CreatePipetrainChannel(address)) {
    assembler_.set_header_check([](MessageKind kind, const v1::FrameHeader& h) {
      if (!UpstreamStream::IsEchoSized(kind, h)) {
        return absl::InvalidArgumentError(
            "the probe's echo is not the small activation it sent");
      }
      return absl::OkStatus();
    });
  }

  void Start() {
    stub_.PrepareBidiStreamingCall(&context_, kProbeMethod, grpc::StubOptions(),
                                   this);
    AddHold();  // until Close
    Enqueue({EncodeEchoHello()});
    StartRead(&in_);
    StartCall();
  }

  absl::Status Send(const StageMessage& message) {
    ASSIGN_OR_RETURN(std::vector<grpc::ByteBuffer> frames,
                     EncodeMessage("", message, v1::DTYPE_F32));
    Enqueue(std::move(frames));
    return absl::OkStatus();
  }

  absl::StatusOr<StageMessage> Receive(int64_t step, double seconds) {
    return mailbox_.Receive(
        MessageKind::kActivation, step, 0, 0,
        std::chrono::steady_clock::now() +
            std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                std::chrono::duration<double>(seconds)));
  }

  // Cancels the stream and waits until gRPC is done with it; no Send
  // after. The stream's status: CANCELLED when it was still open, else how
  // the server ended it.
  absl::Status Close() {
    context_.TryCancel();
    RemoveHold();
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; };
    mu_.Await(absl::Condition(&done));
    return status_;
  }

  void OnWriteDone(bool ok) override {
    bool start = false;
    {
      absl::MutexLock lock(&mu_);
      start = writes_.WriteDone(ok);
    }
    if (start) StartWrite(&writes_.current);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the stream ended; Close gives its status
      mailbox_.Fail(absl::UnavailableError("the probe stream ended"));
      return;
    }
    absl::StatusOr<DecodedFrame> decoded = assembler_.Add(in_);
    absl::Status status = decoded.status();
    if (status.ok() && decoded->message.has_value()) {
      status = mailbox_.Deliver(std::move(*decoded->message));
    }
    if (!status.ok()) {
      mailbox_.Fail(status);
      context_.TryCancel();
      return;
    }
    StartRead(&in_);
  }

  void OnDone(const grpc::Status& status) override {
    absl::Status why = FromGrpcStatus(status);
    if (why.ok()) why = absl::UnavailableError("the server closed the stream");
    mailbox_.Fail(why);
    absl::MutexLock lock(&mu_);
    status_ = why;
    done_ = true;
  }

 private:
  void Enqueue(std::vector<grpc::ByteBuffer> frames) {
    bool start = false;
    {
      absl::MutexLock lock(&mu_);
      start = writes_.Push(std::move(frames));
    }
    // Only this thread may touch `current` until OnWriteDone.
    if (start) StartWrite(&writes_.current);
  }

  grpc::GenericStub stub_;
  grpc::ClientContext context_;
  // Used only by read reactions (one read in flight).
  grpc::ByteBuffer in_;
  FrameAssembler assembler_;
  Mailbox mailbox_;
  absl::Mutex mu_;
  WriteQueue writes_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// One series of round trips on `stream`: `options.warmup` untimed, then
// `options.messages` timed, each message of `floats` values after an idle
// gap, numbered from *step on.
struct ProbeSeries {
  std::vector<double> round_trips;
  // Process CPU per round trip, per batch of kCpuBatch.
  std::vector<double> cpu_per_round;
};
absl::StatusOr<ProbeSeries> RunSeries(ProbeStream* stream, int floats,
                                      const StreamProbeOptions& options,
                                      int64_t* step) {
  StageMessage message;
  message.kind = MessageKind::kActivation;
  message.tensors = {Tensor::Host({1, floats})};
  float* values = message.tensors[0].f32();
  for (int i = 0; i < floats; ++i) values[i] = 0.25f * i;
  ProbeSeries out;
  const int rounds = options.warmup + options.messages;
  const int batch = std::min(options.messages, kCpuBatch);
  // The CPU of a batch counts its gaps too: what gRPC's threads do after
  // a message has arrived (finishing a write, going back to sleep) is
  // still the message's.
  double batch_start = 0;
  for (int i = 0; i < rounds; ++i) {
    if (i == options.warmup) batch_start = ProcessCpuSeconds();
    std::this_thread::sleep_for(
        std::chrono::duration<double>(options.gap_seconds));
    message.step = (*step)++;
    const auto start = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(stream->Send(message));
    ASSIGN_OR_RETURN(StageMessage echo,
                     stream->Receive(message.step, options.deadline_seconds));
    const double seconds = SecondsSince(start);
    if (echo.tensors.size() != 1 || echo.tensors[0].numel() != floats ||
        !std::equal(values, values + floats, echo.tensors[0].f32())) {
      return absl::DataLossError("the probe's echo differs from what it sent");
    }
    if (i < options.warmup) continue;
    out.round_trips.push_back(seconds);
    if (out.round_trips.size() % batch == 0) {
      // Past the batch's last echo: its trailing work had the next gap.
      std::this_thread::sleep_for(
          std::chrono::duration<double>(options.gap_seconds));
      out.cpu_per_round.push_back((ProcessCpuSeconds() - batch_start) / batch);
      // Batches spread over a longer time: a burst of other work on the
      // machine sways fewer of them.
      std::this_thread::sleep_for(
          std::chrono::duration<double>(options.batch_gap_seconds));
      batch_start = ProcessCpuSeconds();
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<StreamMessageCost> MeasureStreamMessageCost(
    const std::string& own_address, const StreamProbeOptions& options) {
  const int64_t max_floats = UpstreamStream::kMaxEchoBytes / 4;
  if (options.messages < 1 || options.warmup < 0 || options.floats < 1 ||
      options.floats > max_floats || options.large_floats < 0 ||
      options.large_floats > max_floats ||
      (options.large_floats > 0 && options.large_messages < 1) ||
      (options.large_floats > 0 && options.large_floats <= options.floats) ||
      !(options.gap_seconds >= 0) || !(options.batch_gap_seconds >= 0) ||
      !(options.deadline_seconds > 0)) {
    return absl::InvalidArgumentError("bad stream probe options");
  }
  ProbeStream stream(own_address);
  stream.Start();
  int64_t step = 0;
  absl::StatusOr<ProbeSeries> small =
      RunSeries(&stream, options.floats, options, &step);
  absl::StatusOr<ProbeSeries> large = ProbeSeries{};
  if (small.ok() && options.large_floats > 0) {
    StreamProbeOptions large_options = options;
    large_options.messages = options.large_messages;
    large = RunSeries(&stream, options.large_floats, large_options, &step);
  }
  absl::Status failure = small.ok() ? large.status() : small.status();
  const absl::Status ended = stream.Close();
  // The server's reason, where it ended the stream first (it refused the
  // probe, or a message).
  if (!failure.ok() && !ended.ok() && !absl::IsCancelled(ended)) {
    failure = ended;
  }
  if (!failure.ok()) {
    return absl::Status(
        failure.code(),
        absl::StrCat("stream probe on ", own_address, ": ", failure.message()));
  }
  // A round trip: two messages, four message ends, all in this process.
  StreamMessageCost cost;
  cost.hop_seconds = Median(small->round_trips) / 2;
  cost.cpu_seconds = Median(small->cpu_per_round) / 4;
  if (options.large_floats > 0) {
    const double extra_bytes =
        4.0 * static_cast<double>(options.large_floats - options.floats);
    cost.cpu_seconds_per_byte =
        std::max(0.0, (Median(large->cpu_per_round) / 4 - cost.cpu_seconds) /
                          extra_bytes);
  }
  return cost;
}

}  // namespace pipetrain
