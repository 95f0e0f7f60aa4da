// The wire codec of the stage-to-stage stream.
//
// A StageMessage becomes one or more frames (gRPC messages of raw bytes):
//   [u32 little-endian header length][FrameHeader][payload bytes]
// The payload of a message is its tensors laid end to end, each starting at
// an 8-byte-aligned offset. Frames carry consecutive ranges of at most
// `chunk_bytes` payload bytes (rounded up to a multiple of 8, so no element
// straddles two frames).
//
// The wire dtype: a stage's messages hold float32 tensors; an activation's
// or gradient's own tensor (StageMessage::tensors[0], the only one they
// carry) may travel narrowed to bf16 or fp16, the stage's configured wire
// dtype. The
// encoder narrows it straight into the frames' payload; the decoder widens
// it back to float32 straight from gRPC's receive buffers and rejects a
// message whose tensors do not travel in the dtypes it expects.
//
// Quantized wire (WireCompression): when the job quantizes a message's
// direction (activations: ACTIVATION and EVAL_ACTIVATION; gradients:
// GRADIENT), its payload tensor travels as int8 or int4 codes
// (services/wire/quantize.h; TensorMeta dtype DTYPE_INT8 / DTYPE_INT4 with
// the effective group size in TensorMeta.group_size), its byte count
// spec/wire_size.h's StreamedTensorWireBytes. The encoder quantizes the
// float32 tensor once, straight into a buffer the frames' payload slices
// share. Frames still end on multiples of 8 payload bytes, so a quantized
// row (whose byte count is anything) may straddle frames: the decoder
// decodes every row whose bytes are all in straight from gRPC's receive
// buffer into the float32 destination, and copies the bytes of at most
// one cut row per message aside until the next frame completes it. The
// receiver rejects a message whose payload does not travel in the format
// its stage's WireCompression says (dtype, group size, byte count).
//
// Encoding a float32 wire never copies tensor data: payload slices point
// into the tensors' storage and keep it alive until gRPC has written them.
// Decoding copies (or widens) each payload byte once, into the message's
// tensor storage.
#ifndef PIPETRAIN_SERVICES_WIRE_FRAME_CODEC_H_
#define PIPETRAIN_SERVICES_WIRE_FRAME_CODEC_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/support/byte_buffer.h"
#include "pipetrain/v1/stage.pb.h"
#include "services/wire/buffer_pool.h"
#include "worker/pipeline/mailbox.h"

namespace pipetrain {

inline constexpr size_t kDefaultChunkBytes = 1 << 20;
// Messages above this size are rejected as malformed.
inline constexpr int64_t kMaxMessageBytes = int64_t{8} << 30;

// Frames of a HELLO (the first message an upstream stage sends).
grpc::ByteBuffer EncodeHello(const std::string& job_id, int stage);
// The HELLO of a message-cost probe stream (FrameHeader.echo): no job.
grpc::ByteBuffer EncodeEchoHello();

// How a stage's payload tensors travel: quantized where `compression`
// quantizes the message's direction, else in `dtype` (f32, bf16, f16).
struct WireFormat {
  v1::DType dtype = v1::DTYPE_F32;
  v1::WireCompression compression;
  // Stochastic rounding: the sending end's seed (WireSeed); the encoder
  // mixes in the message's kind, chunk, step and micro-batch, so a run
  // encodes the same bytes every time.
  uint64_t seed = 0;
};

// The seed of what stage `stage` of job `job_id` sends.
uint64_t WireSeed(const std::string& job_id, int stage);

// The quantization (NONE, INT8, INT4) `format` applies to the payload of
// a `kind` message.
v1::WireQuantization PayloadQuantization(const WireFormat& format,
                                         MessageKind kind);

// Frames of one message, its float32 payload tensor narrowed to
// `wire_dtype` (tensors in another dtype travel as they are, for the
// receiver to judge). InvalidArgument for tensors that are not on the host
// or an unknown wire dtype.
absl::StatusOr<std::vector<grpc::ByteBuffer>> EncodeMessage(
    const std::string& job_id, const StageMessage& message,
    v1::DType wire_dtype, size_t chunk_bytes = kDefaultChunkBytes);

// Frames of one message in `format`: as above, or, where the format
// quantizes the message's direction, its float32 payload tensor quantized.
// `residual` (nullable; the payload's element count of floats) is error
// feedback for a quantized payload: added to the tensor before it is
// quantized and replaced by the new quantization error (quantize.h); the
// caller owns it and ignores it for an unquantized payload. Also
// InvalidArgument for a payload holding NaN or Inf (the residual is then
// garbage: reset it).
absl::StatusOr<std::vector<grpc::ByteBuffer>> EncodeMessage(
    const std::string& job_id, const StageMessage& message,
    const WireFormat& format, size_t chunk_bytes = kDefaultChunkBytes,
    float* residual = nullptr);

// The bytes a message's tensors take on the wire with `wire_dtype` /
// `format` (alignment gaps and headers left out): what the stage metrics
// count.
int64_t WirePayloadBytes(const StageMessage& message, v1::DType wire_dtype);
int64_t WirePayloadBytes(const StageMessage& message, const WireFormat& format);

// What one decoded frame contributed.
struct DecodedFrame {
  v1::FrameHeader header;
  // Set when this frame completed a message.
  std::optional<StageMessage> message;
};

// The message a frame header announces, with storage-less tensors of the
// announced shapes (float32, as the decoder delivers them): what a
// receiver checks against the shapes it expects before a byte of the
// message is allocated. Payload tensor dtypes are the assembler's check.
StageMessage MessageOutline(MessageKind kind, const v1::FrameHeader& header);

// Judges a frame's header before the assembler allocates anything for it;
// an error rejects the frame (the stream's owner decides what follows).
using FrameHeaderCheck =
    std::function<absl::Status(MessageKind kind, const v1::FrameHeader&)>;

// Messages one stream may have in assembly at once. A stage sends each
// message's frames back to back, so one is the norm; the cap bounds what a
// peer that starts messages and never ends them can hold.
inline constexpr size_t kDefaultMaxPartialMessages = 4;
// A message in assembly that receives no frame for this long is dropped
// (its buffer goes back to the pool) when the stream's next frame arrives:
// a peer's sender writes a message's frames back to back, so a message
// left unfinished this long will not be finished, and it must not hold one
// of the stream's few partial-message places for the stream's lifetime.
inline constexpr absl::Duration kDefaultPartialMessageTimeout =
    absl::Seconds(60);

// Reassembles the messages of one stream. Not thread-safe: one per stream,
// used by that stream's read reactions.
class FrameAssembler {
 public:
  // Message buffers come from `pool` (shared by a process's streams) or,
  // when null, from a pool of this assembler's own.
  explicit FrameAssembler(std::shared_ptr<HostBufferPool> pool = nullptr);

  // The dtype payload tensors must travel in (float32 until set); the
  // stream sets its stage's configured wire dtype.
  void set_wire_dtype(v1::DType wire_dtype) { format_.dtype = wire_dtype; }
  // The whole format payload tensors must travel in: the dtype and, for
  // the directions it quantizes, the quantization and group size.
  void set_wire_format(const WireFormat& format) { format_ = format; }
  // Every message frame's header passes `check` first (HELLO frames are
  // the stream's to judge); none by default.
  void set_header_check(FrameHeaderCheck check) {
    header_check_ = std::move(check);
  }
  void set_max_partial_messages(size_t n) { max_partial_ = n; }
  void set_partial_message_timeout(absl::Duration timeout) {
    partial_timeout_ = timeout;
  }
  // The clock the timeout is measured with (absl::Now unless set).
  void set_clock(std::function<absl::Time()> now) { now_ = std::move(now); }

  // InvalidArgument for a malformed frame (bad header, unknown kind or
  // dtype, a tensor not in the expected dtype (or quantization and group
  // size), a byte count that does not
  // match the tensors' shapes, frames out of order or cut inside an
  // element, an oversize message); the header check's error; and
  // ResourceExhausted for a message past the partial-message cap or one
  // whose buffer cannot be had. Decoded messages hold float32 tensors.
  absl::StatusOr<DecodedFrame> Add(const grpc::ByteBuffer& frame);
  size_t pending() const { return partial_.size(); }
  // Messages dropped unfinished by the timeout so far.
  int64_t evicted() const { return evicted_; }

 private:
  struct Partial {
    v1::FrameHeader header;
    std::shared_ptr<Storage> storage;
    int64_t received = 0;
    absl::Time last_frame;
    // The bytes of a quantized row cut by a frame boundary, until the next
    // frame completes it.
    std::vector<uint8_t> row_carry;
  };
  using Key = std::tuple<int, int64_t, int32_t, int32_t>;  // + chunk
  // The message `key` a frame with header `h` continues (started when it
  // is the first frame); InvalidArgument for a frame out of order.
  absl::StatusOr<Partial*> PartialFor(const Key& key, const v1::FrameHeader& h,
                                      int64_t widened_bytes);
  // Drops the messages whose last frame is older than the timeout.
  void EvictStale(absl::Time now);
  std::shared_ptr<HostBufferPool> pool_;
  absl::Duration partial_timeout_ = kDefaultPartialMessageTimeout;
  std::function<absl::Time()> now_ = [] { return absl::Now(); };
  int64_t evicted_ = 0;
  WireFormat format_;
  FrameHeaderCheck header_check_;
  size_t max_partial_ = kDefaultMaxPartialMessages;
  std::map<Key, Partial> partial_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_WIRE_FRAME_CODEC_H_
