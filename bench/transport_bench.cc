// bench_transport: activation-sized tensors (1, 4, 16, 64 MiB) streamed
// between two processes on loopback with the stage stream's wire codec
// (1 MiB frames, zero-copy payload slices, one write in flight) over gRPC,
// beside raw TCP between two sockets moving the same bytes, in one run.
// Each receiver ends with every message whole in its memory, as a stage
// needs it, in buffers it keeps from one round to the next (the stream's
// from one pool over the rounds' streams, as a stage's stream keeps its
// pool for its job): a fresh 64 MiB buffer a round had cost the stream a
// page fault per 4 KiB and half its throughput at that size. For
// reference, raw TCP into a 4 MiB scratch buffer that is overwritten (the
// baseline before; it holds no message) is measured beside them.
//
// Both sides pipeline: the sender queues every message, the receiver
// acknowledges each whole message, and the clock stops at the last ack.
// Each size runs one uncounted round, then five rounds, each sending with
// the stage stream and then with raw TCP. It prints its ratio (stage stream
// / raw TCP throughput, each side's best round) and the median and range
// of the rounds' own ratios: on a shared 2-core machine the stream's
// rounds have run from a quarter of its best to its best. Beside them, the
// share of the stream's counted time spent in stalls: gaps of more than
// kStallSeconds between one frame's write completing and the next's (at
// 1 MiB frames a write takes 0.1-0.8 ms when the stream runs well); the
// slow rounds are made of them. Last line:
// {"bench":"transport", ..., "ratio_vs_tcp": <the smallest ratio over the
// sizes of at least 1 MiB>, "ratio_vs_tcp_1mib": ..., "ratio_vs_tcp_4mib":
// ..., "ratio_<n>mib", "ratio_median_<n>mib", "stall_share_<n>mib",
// "tcp_scratch_gbps_<n>mib", "ratio_vs_scratch_<n>mib"}: the headline is
// the worst size, not the best-looking one.
//
// First, in one process, the codec's own cost on the critical path: a
// 16 MiB float32 activation ([16384, 256]) encoded into 1 MiB frames and
// decoded back to float32 by a FrameAssembler, per wire format (f32, bf16,
// int8 and int4 with 128-element groups, nearest and stochastic
// rounding): GB/s of float32 tensor per second each way (best of 10) and
// the wire bytes as a share of float32's. In the JSON: "codec_<format>_
// encode_gbps", "..._decode_gbps", "..._bytes_ratio".
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "bench/bench_env.h"
#include "common/heap_tuning.h"
#include "common/median.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "services/rpc/grpc_server.h"
#include "services/rpc/grpc_util.h"
#include "services/wire/buffer_pool.h"
#include "services/wire/frame_codec.h"

namespace pipetrain {
namespace {

constexpr int64_t kMiB = 1 << 20;
constexpr int64_t kBytesPerSize = 512 * kMiB;
// Counted rounds per size, each side once a round.
constexpr int kRounds = 5;
// A gap between write completions longer than this is a stall.
constexpr double kStallSeconds = 0.002;

// Frame payload size; PIPETRAIN_CHUNK_BYTES overrides it for experiments.
// Read once, first thing in Main: a bad value stops the bench before it
// forks its receiver.
size_t ChunkBytes() {
  static const size_t bytes = static_cast<size_t>(
      PositiveEnvInt("PIPETRAIN_CHUNK_BYTES", kDefaultChunkBytes));
  return bytes;
}

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---- Receiver (child process) ----

// Decodes frames; acknowledges each whole message with one small frame.
// gRPC calls the reactions one read and one write at a time, possibly on
// different threads: mu_ guards the write side they share.
class SinkReactor : public grpc::ServerGenericBidiReactor {
 public:
  explicit SinkReactor(std::shared_ptr<HostBufferPool> pool)
      : assembler_(std::move(pool)) {
    StartRead(&in_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    auto decoded = assembler_.Add(in_);
    if (!decoded.ok()) {
      Finish(ToGrpcStatus(decoded.status()));
      return;
    }
    if (decoded->message.has_value()) {
      absl::MutexLock lock(&mu_);
      if (writing_) {
        ++pending_acks_;
      } else {
        writing_ = true;
        StartWrite(&ack_);
      }
    }
    StartRead(&in_);
  }
  void OnWriteDone(bool) override {
    absl::MutexLock lock(&mu_);
    if (pending_acks_ > 0) {
      --pending_acks_;
      StartWrite(&ack_);
    } else {
      writing_ = false;
    }
  }
  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer in_;
  grpc::ByteBuffer ack_ = EncodeHello("ack", 0);
  FrameAssembler assembler_;
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  int pending_acks_ ABSL_GUARDED_BY(mu_) = 0;
};

// Every round opens a stream of its own; its messages are assembled in
// buffers from one pool that outlives them, as a stage's stream, which
// lasts for its job, reuses its buffers from one micro-batch to the next.
class SinkService : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext*) override {
    return new SinkReactor(pool_);
  }
  const std::shared_ptr<HostBufferPool> pool_ =
      HostBufferPool::Create(size_t{256} << 20);
};

int ListenTcp(int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  listen(fd, 4);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *port = ntohs(addr.sin_port);
  return fd;
}

// Reads messages of [u64 size][payload] and answers one byte for each.
// Each message lands whole in one buffer, as a stage needs its tensor: a
// buffer of the message's size, kept from one message and connection to
// the next as the stream's pool keeps its buffers. A size with
// kScratchFlag set asks for the old baseline instead: the bytes read into
// a 4 MiB buffer that is overwritten (and stays in cache), the tensor
// never held.
constexpr uint64_t kScratchFlag = uint64_t{1} << 63;

void TcpSink(int listen_fd) {
  std::vector<char> message;
  std::vector<char> scratch(4 * kMiB);
  while (true) {
    const int fd = accept(listen_fd, nullptr, nullptr);
    if (fd < 0) return;
    while (true) {
      uint64_t size = 0;
      if (recv(fd, &size, sizeof(size), MSG_WAITALL) != sizeof(size)) break;
      const bool to_scratch = (size & kScratchFlag) != 0;
      size &= ~kScratchFlag;
      if (!to_scratch && message.size() < size) message.resize(size);
      uint64_t offset = 0;
      while (offset < size) {
        const ssize_t n =
            to_scratch
                ? recv(fd, scratch.data(),
                       std::min<uint64_t>(size - offset, scratch.size()), 0)
                : recv(fd, message.data() + offset, size - offset, 0);
        if (n <= 0) break;
        offset += n;
      }
      const char ack = 1;
      if (send(fd, &ack, 1, 0) != 1) break;
    }
    close(fd);
  }
}

[[noreturn]] void RunReceiver(int report_fd) {
  SinkService service;
  grpc::ServerBuilder builder;
  ConfigureServerBuilder(&builder);
  int grpc_port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &grpc_port);
  builder.RegisterCallbackGenericService(&service);
  auto server = builder.BuildAndStart();
  int tcp_port = 0;
  const int tcp_fd = ListenTcp(&tcp_port);
  const int ports[2] = {grpc_port, tcp_port};
  if (write(report_fd, ports, sizeof(ports)) != sizeof(ports)) _exit(1);
  TcpSink(tcp_fd);
  _exit(0);
}

// ---- Sender (parent process) ----

// Sends `count` messages of `bytes` each; returns seconds until the last ack.
// Run() blocks its caller while gRPC's threads run the reactions (one read
// and one write in flight); mu_ guards what both sides read.
class GrpcSender
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  GrpcSender(std::shared_ptr<grpc::Channel> channel, int64_t bytes, int count)
      : stub_(channel), count_(count) {
    // One payload, touched once, sent `count` times (as a stage sends the
    // activations it just computed).
    static Tensor payload;
    if (payload.empty() || payload.bytes() != static_cast<size_t>(bytes)) {
      payload = Tensor::Host({bytes / 4});
      for (int64_t i = 0; i < payload.numel(); ++i) payload.f32()[i] = i;
    }
    StageMessage msg;
    msg.kind = MessageKind::kActivation;
    msg.tensors = {payload};
    for (int i = 0; i < count; ++i) {
      msg.step = i;
      auto frames = EncodeMessage("bench", msg, v1::DTYPE_F32, ChunkBytes());
      for (auto& f : *frames) pending_.push_back(std::move(f));
    }
  }
  double Run() {
    stub_.PrepareBidiStreamingCall(&ctx_, "/bench.Sink/Stream",
                                   grpc::StubOptions(), this);
    const double start = Now();
    StartRead(&ack_);
    WriteNext();
    StartCall();
    double seconds = 0;
    {
      absl::MutexLock lock(&mu_);
      while (acks_ < count_ && !failed_) cv_.Wait(&mu_);
      seconds = Now() - start;
    }
    StartWritesDone();
    absl::MutexLock lock(&mu_);
    while (!done_) cv_.Wait(&mu_);
    return failed_ ? -1 : seconds;
  }
  // After Run: the seconds spent in gaps longer than kStallSeconds between
  // consecutive write completions.
  double stalled_seconds() const { return stalled_seconds_; }
  void OnWriteDone(bool ok) override {
    // Reactions run one write at a time; Run's caller reads the sum only
    // after OnDone, under mu_.
    const double now = Now();
    if (last_write_done_ > 0 && now - last_write_done_ > kStallSeconds) {
      stalled_seconds_ += now - last_write_done_;
    }
    last_write_done_ = now;
    if (ok) WriteNext();
  }
  void OnReadDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    if (!ok) return;
    ++acks_;
    cv_.SignalAll();
    if (acks_ < count_) StartRead(&ack_);
  }
  void OnDone(const grpc::Status& s) override {
    absl::MutexLock lock(&mu_);
    failed_ = failed_ || !s.ok();
    done_ = true;
    cv_.SignalAll();
  }

 private:
  void WriteNext() {
    if (pending_.empty()) return;
    current_ = std::move(pending_.front());
    pending_.pop_front();
    StartWrite(&current_);
  }
  grpc::GenericStub stub_;
  grpc::ClientContext ctx_;
  std::deque<grpc::ByteBuffer> pending_;
  grpc::ByteBuffer current_;
  grpc::ByteBuffer ack_;
  double last_write_done_ = 0;
  double stalled_seconds_ = 0;
  const int count_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  int acks_ ABSL_GUARDED_BY(mu_) = 0;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

// `scratch`: the receiver reads into its overwritten 4 MiB buffer
// (kScratchFlag) instead of holding each message.
double TcpSend(int port, int64_t bytes, int count, bool scratch) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    return -1;
  std::vector<char> payload(bytes, 1);
  const double start = Now();
  std::thread acks([&] {
    char ack;
    for (int i = 0; i < count; ++i) recv(fd, &ack, 1, MSG_WAITALL);
  });
  for (int i = 0; i < count; ++i) {
    const uint64_t size = bytes | (scratch ? kScratchFlag : 0);
    send(fd, &size, sizeof(size), 0);
    int64_t sent = 0;
    while (sent < bytes) {
      const ssize_t n = send(fd, payload.data() + sent, bytes - sent, 0);
      if (n <= 0) break;
      sent += n;
    }
  }
  acks.join();
  const double seconds = Now() - start;
  close(fd);
  return seconds;
}

// ---- Codec cost (in process) ----

struct CodecFormat {
  const char* name;
  v1::DType dtype;
  v1::WireQuantization quantization;
  v1::WireRounding rounding;
};

// Encodes and decodes `tensor` in `format` `reps` times; appends the
// figures to `json`.
bool MeasureCodec(const CodecFormat& f, const Tensor& tensor, int reps,
                  std::string* json) {
  WireFormat format;
  format.dtype = f.dtype;
  format.compression.set_activations(f.quantization);
  format.compression.set_rounding(f.rounding);
  format.seed = 1;
  StageMessage message;
  message.kind = MessageKind::kActivation;
  message.tensors = {tensor};
  FrameAssembler assembler;
  assembler.set_wire_format(format);
  double best_encode = 1e9, best_decode = 1e9;
  for (int rep = 0; rep < reps; ++rep) {
    message.micro_batch = rep;
    const double t0 = Now();
    auto frames = EncodeMessage("job", message, format, kDefaultChunkBytes);
    const double t1 = Now();
    if (!frames.ok()) {
      std::fprintf(stderr, "%s: %s\n", f.name,
                   std::string(frames.status().message()).c_str());
      return false;
    }
    std::optional<StageMessage> out;
    for (const grpc::ByteBuffer& frame : *frames) {
      auto decoded = assembler.Add(frame);
      if (!decoded.ok()) return false;
      if (decoded->message.has_value()) out = std::move(decoded->message);
    }
    const double t2 = Now();
    if (!out.has_value()) return false;
    best_encode = std::min(best_encode, t1 - t0);
    best_decode = std::min(best_decode, t2 - t1);
  }
  const double f32_bytes = static_cast<double>(tensor.numel()) * 4;
  const double ratio = WirePayloadBytes(message, format) / f32_bytes;
  std::printf(
      "codec %-15s encode %6.2f GB/s, decode %6.2f GB/s of float32; wire "
      "bytes %.3f of f32\n",
      f.name, f32_bytes / best_encode / 1e9, f32_bytes / best_decode / 1e9,
      ratio);
  *json += absl::StrFormat(
      ",\"codec_%s_encode_gbps\":%.3f,\"codec_%s_decode_gbps\":%.3f,"
      "\"codec_%s_bytes_ratio\":%.4f",
      f.name, f32_bytes / best_encode / 1e9, f.name,
      f32_bytes / best_decode / 1e9, f.name, ratio);
  return true;
}

bool MeasureCodecs(std::string* json) {
  Tensor tensor = Tensor::Host({16384, 256});
  uint64_t state = 12345;
  for (int64_t i = 0; i < tensor.numel(); ++i) {  // activation-like values
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    tensor.f32()[i] = static_cast<float>(state >> 40) / (1 << 24) * 4 - 1;
  }
  const CodecFormat formats[] = {
      {"f32", v1::DTYPE_F32, v1::WIRE_QUANTIZATION_NONE,
       v1::WIRE_ROUNDING_NEAREST},
      {"bf16", v1::DTYPE_BF16, v1::WIRE_QUANTIZATION_NONE,
       v1::WIRE_ROUNDING_NEAREST},
      {"int8", v1::DTYPE_F32, v1::WIRE_QUANTIZATION_INT8,
       v1::WIRE_ROUNDING_NEAREST},
      {"int8_stochastic", v1::DTYPE_F32, v1::WIRE_QUANTIZATION_INT8,
       v1::WIRE_ROUNDING_STOCHASTIC},
      {"int4", v1::DTYPE_F32, v1::WIRE_QUANTIZATION_INT4,
       v1::WIRE_ROUNDING_NEAREST},
      {"int4_stochastic", v1::DTYPE_F32, v1::WIRE_QUANTIZATION_INT4,
       v1::WIRE_ROUNDING_STOCHASTIC},
  };
  for (const CodecFormat& f : formats) {
    if (!MeasureCodec(f, tensor, 10, json)) return false;
  }
  return true;
}

int Main() {
  (void)ChunkBytes();
  // As a worker sets its heap (worker_main), on both ends (the receiver
  // is forked from this process).
  KeepFreedHeapMemory();
  std::string json = "{\"bench\":\"transport\"";
  if (!MeasureCodecs(&json)) return 1;
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return 1;
  const pid_t child = fork();
  if (child == 0) {
    close(pipe_fds[0]);
    RunReceiver(pipe_fds[1]);
  }
  close(pipe_fds[1]);
  int ports[2];
  if (read(pipe_fds[0], ports, sizeof(ports)) != sizeof(ports)) return 1;
  auto channel =
      CreatePipetrainChannel(absl::StrFormat("127.0.0.1:%d", ports[0]));
  double worst_ratio = 1e9;  // over sizes >= 1 MiB
  double ratio_1mib = 0, ratio_4mib = 0;
  for (int64_t mib : {1, 4, 16, 64}) {
    const int64_t bytes = mib * kMiB;
    const int count = static_cast<int>(kBytesPerSize / bytes);
    // Interleaved rounds after one uncounted round: the best of each side
    // (the headline; interference only slows a round), and the median of
    // the rounds' own ratios beside it (how the stream runs as a rule).
    double best_grpc = 1e9, best_tcp = 1e9, best_scratch = 1e9;
    std::vector<double> round_ratios;
    double stalled = 0, stream_seconds = 0;  // over the counted rounds
    for (int round = -1; round < kRounds; ++round) {
      GrpcSender sender(channel, bytes, count);
      const double g = sender.Run();
      const double t = TcpSend(ports[1], bytes, count, /*scratch=*/false);
      const double r = TcpSend(ports[1], bytes, count, /*scratch=*/true);
      if (g < 0 || t < 0 || r < 0) {
        std::fprintf(stderr, "transfer failed\n");
        kill(child, SIGKILL);
        return 1;
      }
      if (round < 0) continue;
      best_grpc = std::min(best_grpc, g);
      best_tcp = std::min(best_tcp, t);
      best_scratch = std::min(best_scratch, r);
      round_ratios.push_back(t / g);
      stalled += sender.stalled_seconds();
      stream_seconds += g;
    }
    const auto [lowest, highest] =
        std::minmax_element(round_ratios.begin(), round_ratios.end());
    const double median_ratio = Median(round_ratios);
    const double grpc_gbs = count * bytes / best_grpc / 1e9;
    const double tcp_gbs = count * bytes / best_tcp / 1e9;
    const double ratio = grpc_gbs / tcp_gbs;
    if (mib >= 1) worst_ratio = std::min(worst_ratio, ratio);
    if (mib == 1) ratio_1mib = ratio;
    if (mib == 4) ratio_4mib = ratio;
    const double stall_share = stalled / stream_seconds;
    const double scratch_gbs = count * bytes / best_scratch / 1e9;
    std::printf(
        "%3lld MiB tensors: stage stream %.2f GB/s, raw TCP %.2f GB/s, ratio "
        "%.3f (best of %d rounds each); round by round median %.3f [%.3f, "
        "%.3f]; stalls %.0f%% of the stream's time; for reference, raw TCP "
        "into a 4 MiB scratch buffer %.2f GB/s (stream %.3f of it)\n",
        static_cast<long long>(mib), grpc_gbs, tcp_gbs, ratio, kRounds,
        median_ratio, *lowest, *highest, 100 * stall_share, scratch_gbs,
        grpc_gbs / scratch_gbs);
    const int n = static_cast<int>(mib);
    json += absl::StrFormat(
        ",\"grpc_gbps_%dmib\":%.3f,\"tcp_gbps_%dmib\":%.3f,\"ratio_%dmib\":%."
        "3f,\"ratio_median_%dmib\":%.3f,\"stall_share_%dmib\":%.3f,"
        "\"tcp_scratch_gbps_%dmib\":%.3f,\"ratio_vs_scratch_%dmib\":%.3f",
        n, grpc_gbs, n, tcp_gbs, n, ratio, n, median_ratio, n, stall_share, n,
        scratch_gbs, n, grpc_gbs / scratch_gbs);
  }
  json += absl::StrFormat(
      ",\"ratio_vs_tcp\":%.3f,\"ratio_vs_tcp_1mib\":%.3f,"
      "\"ratio_vs_tcp_4mib\":%.3f}",
      worst_ratio, ratio_1mib, ratio_4mib);
  std::printf("%s\n", json.c_str());
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  return 0;
}

}  // namespace
}  // namespace pipetrain

int main() { return pipetrain::Main(); }
