// A stage's state on the wire: tensors cut into StateChunks (at most about
// 1 MiB of data each, chunks of one tensor consecutive) and reassembled,
// checking that every tensor arrives whole, in order and with the size its
// shape says. Used by the gRPC stage control on both directions and by
// tests; no gRPC here.
#ifndef PIPETRAIN_SCHEDULER_STATE_CHUNKS_H_
#define PIPETRAIN_SCHEDULER_STATE_CHUNKS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "pipetrain/v1/stage.pb.h"
#include "scheduler/interfaces.h"

namespace pipetrain {

inline constexpr size_t kStateChunkBytes = size_t{1} << 20;

// The chunks of `tensor`, each carrying `info` and the tensor's name and
// shape. A tensor with no elements still gets one (empty) chunk.
std::vector<v1::StateChunk> ChunksOf(const std::string& job_id,
                                     const StageStateInfo& info,
                                     const StateTensor& tensor,
                                     size_t chunk_bytes = kStateChunkBytes);

// Reassembles a chunk stream into tensors, handing each to a sink as soon
// as its last byte arrived. Not thread-safe; one per stream.
class StateChunkAssembler {
 public:
  explicit StateChunkAssembler(StageStateSink sink);

  // InvalidArgument for a chunk that does not continue the stream (wrong
  // offset, another tensor before the previous one ended, a dtype other
  // than F32, a size that does not match the shape); the sink's error.
  absl::Status Add(const v1::StateChunk& chunk);
  // InvalidArgument when the stream ended inside a tensor.
  absl::Status Finish();

  int64_t tensors() const { return tensors_; }

 private:
  StageStateSink sink_;
  std::optional<StateTensor> current_;
  StageStateInfo info_;
  int64_t total_bytes_ = 0;
  int64_t tensors_ = 0;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_STATE_CHUNKS_H_
