// The wire codec of the stage-to-stage stream.
//
// A StageMessage becomes one or more frames (gRPC messages of raw bytes):
//   [u32 little-endian header length][FrameHeader][payload bytes]
// The payload of a message is its tensors laid end to end, each starting at
// an 8-byte-aligned offset. Frames carry consecutive ranges of at most
// `chunk_bytes` payload bytes. Encoding never copies tensor data: payload
// slices point into the tensors' storage and keep it alive until gRPC has
// written them. Decoding copies each payload byte once, from gRPC's receive
// buffers into the message's tensor storage.
#ifndef PIPETRAIN_SERVICES_WIRE_FRAME_CODEC_H_
#define PIPETRAIN_SERVICES_WIRE_FRAME_CODEC_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
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

// Frames of one message. InvalidArgument for tensors that are not on the
// host.
absl::StatusOr<std::vector<grpc::ByteBuffer>> EncodeMessage(
    const std::string& job_id, const StageMessage& message,
    size_t chunk_bytes = kDefaultChunkBytes);

// What one decoded frame contributed.
struct DecodedFrame {
  v1::FrameHeader header;
  // Set when this frame completed a message.
  std::optional<StageMessage> message;
};

// Reassembles the messages of one stream. Not thread-safe: one per stream,
// used by that stream's read reactions.
class FrameAssembler {
 public:
  // Message buffers come from `pool` (shared by a process's streams) or,
  // when null, from a pool of this assembler's own.
  explicit FrameAssembler(std::shared_ptr<HostBufferPool> pool = nullptr);

  // InvalidArgument for a malformed frame (bad header, unknown kind or
  // dtype, a byte count that does not match the tensors' shapes, frames out
  // of order, an oversize message).
  absl::StatusOr<DecodedFrame> Add(const grpc::ByteBuffer& frame);
  size_t pending() const { return partial_.size(); }

 private:
  struct Partial {
    v1::FrameHeader header;
    std::shared_ptr<Storage> storage;
    int64_t received = 0;
  };
  using Key = std::tuple<int, int64_t, int32_t, int32_t>;  // + chunk
  std::shared_ptr<HostBufferPool> pool_;
  std::map<Key, Partial> partial_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_WIRE_FRAME_CODEC_H_
