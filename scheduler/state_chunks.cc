#include "scheduler/state_chunks.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

// Bytes of an F32 tensor of `shape`; -1 for a negative dimension.
int64_t F32Bytes(const google::protobuf::RepeatedField<int64_t>& shape) {
  int64_t n = 4;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    n *= d;
  }
  return n;
}

}  // namespace

std::vector<v1::StateChunk> ChunksOf(const std::string& job_id,
                                     const StageStateInfo& info,
                                     const StateTensor& tensor,
                                     size_t chunk_bytes) {
  std::vector<v1::StateChunk> out;
  const size_t total = tensor.data.size();
  size_t offset = 0;
  do {
    const size_t n = std::min(chunk_bytes, total - offset);
    v1::StateChunk c;
    c.set_job_id(job_id);
    c.set_step(info.step);
    c.set_weight_version(info.weight_version);
    c.set_optimizer_steps(info.optimizer_steps);
    c.set_name(tensor.name);
    c.set_dtype(v1::DTYPE_F32);
    for (int64_t d : tensor.shape) c.add_shape(d);
    c.set_offset(static_cast<int64_t>(offset));
    c.set_total_bytes(static_cast<int64_t>(total));
    c.set_data(tensor.data.substr(offset, n));
    out.push_back(std::move(c));
    offset += n;
  } while (offset < total);
  return out;
}

StateChunkAssembler::StateChunkAssembler(StageStateSink sink)
    : sink_(std::move(sink)) {}

absl::Status StateChunkAssembler::Add(const v1::StateChunk& chunk) {
  const std::string where = absl::StrCat("state chunk of '", chunk.name(),
                                         "' at offset ", chunk.offset());
  if (!current_.has_value()) {
    if (chunk.offset() != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": a tensor must start at offset 0"));
    }
    if (chunk.dtype() != v1::DTYPE_F32) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": dtype ", v1::DType_Name(chunk.dtype()),
                       " (state tensors are F32)"));
    }
    const int64_t expected = F32Bytes(chunk.shape());
    if (expected < 0 || expected != chunk.total_bytes()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": total_bytes ", chunk.total_bytes(),
                       " does not match its shape (", expected, ")"));
    }
    current_.emplace();
    current_->name = chunk.name();
    current_->shape.assign(chunk.shape().begin(), chunk.shape().end());
    current_->data.reserve(chunk.total_bytes());
    total_bytes_ = chunk.total_bytes();
    info_ = {chunk.step(), chunk.weight_version(), chunk.optimizer_steps()};
  } else if (chunk.name() != current_->name ||
             chunk.offset() != static_cast<int64_t>(current_->data.size()) ||
             chunk.total_bytes() != total_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected '", current_->name, "' at offset ",
                     current_->data.size(), " of ", total_bytes_));
  }
  if (static_cast<int64_t>(current_->data.size() + chunk.data().size()) >
      total_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": data runs past total_bytes ", total_bytes_));
  }
  current_->data.append(chunk.data());
  if (static_cast<int64_t>(current_->data.size()) < total_bytes_) {
    return absl::OkStatus();
  }
  StateTensor done = std::move(*current_);
  current_.reset();
  ++tensors_;
  return sink_(info_, std::move(done));
}

absl::Status StateChunkAssembler::Finish() {
  if (!current_.has_value()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("the state stream ended inside '", current_->name, "' (",
                   current_->data.size(), " of ", total_bytes_, " bytes)"));
}

}  // namespace pipetrain
