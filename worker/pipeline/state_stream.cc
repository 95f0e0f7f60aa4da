#include "worker/pipeline/state_stream.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

// Names and job ids come from the network: quote a bounded prefix.
std::string Quoted(const std::string& s) {
  constexpr size_t kMax = 200;
  return absl::StrCat("'", s.substr(0, kMax), s.size() > kMax ? "...'" : "'");
}

absl::Status Bad(const std::string& name, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat("state tensor ", Quoted(name), ": ", why));
}

}  // namespace

StateChunker::StateChunker(std::string job_id,
                           std::shared_ptr<const StageStateSnapshot> snapshot,
                           size_t max_bytes)
    : job_id_(std::move(job_id)),
      snapshot_(std::move(snapshot)),
      max_bytes_(std::max<size_t>(1, max_bytes)),
      tensor_(snapshot_->state.tensors.begin()) {}

bool StateChunker::Next(v1::StateChunk* chunk) {
  if (tensor_ == snapshot_->state.tensors.end()) return false;
  const Tensor& tensor = tensor_->second;
  const int64_t total = tensor.bytes();
  const int64_t n =
      std::min<int64_t>(static_cast<int64_t>(max_bytes_), total - offset_);
  chunk->Clear();
  chunk->set_job_id(job_id_);
  chunk->set_step(snapshot_->step);
  chunk->set_weight_version(snapshot_->weight_version);
  chunk->set_optimizer_steps(snapshot_->state.optimizer_steps);
  chunk->set_name(tensor_->first);
  chunk->set_dtype(v1::DTYPE_F32);
  for (int64_t d : tensor.shape()) chunk->add_shape(d);
  chunk->set_offset(offset_);
  chunk->set_total_bytes(total);
  chunk->set_data(static_cast<const char*>(tensor.raw()) + offset_,
                  static_cast<size_t>(n));
  offset_ += n;
  if (offset_ >= total) {
    ++tensor_;
    offset_ = 0;
  }
  return true;
}

StateAssembler::StateAssembler(std::string job_id, StateLayout layout)
    : job_id_(std::move(job_id)), layout_(std::move(layout)) {}

absl::Status StateAssembler::CheckScalars(const v1::StateChunk& chunk) {
  if (chunk.optimizer_steps() < 0) {
    return Bad(chunk.name(), "optimizer_steps < 0");
  }
  if (first_) {
    first_ = false;
    step_ = chunk.step();
    weight_version_ = chunk.weight_version();
    state_.optimizer_steps = chunk.optimizer_steps();
    return absl::OkStatus();
  }
  if (chunk.step() != step_ || chunk.weight_version() != weight_version_ ||
      chunk.optimizer_steps() != state_.optimizer_steps) {
    return Bad(chunk.name(),
               absl::StrCat("step ", chunk.step(), ", weight version ",
                            chunk.weight_version(), ", optimizer steps ",
                            chunk.optimizer_steps(),
                            " differ from the stream's ", step_, ", ",
                            weight_version_, ", ", state_.optimizer_steps));
  }
  return absl::OkStatus();
}

absl::Status StateAssembler::EndCurrent() const {
  if (name_.empty() || next_offset_ == total_bytes_) return absl::OkStatus();
  return Bad(name_, absl::StrCat("ended after ", next_offset_, " of its ",
                                 total_bytes_, " bytes"));
}

absl::Status StateAssembler::Begin(const v1::StateChunk& chunk) {
  const std::string& name = chunk.name();
  if (chunk.offset() != 0) {
    return Bad(name, absl::StrCat("its first chunk starts at offset ",
                                  chunk.offset(), ", not 0"));
  }
  if (chunk.dtype() != v1::DTYPE_F32) {
    return Bad(name, absl::StrCat("dtype ", v1::DType_Name(chunk.dtype()), " (",
                                  static_cast<int>(chunk.dtype()),
                                  "); state tensors are DTYPE_F32"));
  }
  bool owned = false;
  ASSIGN_OR_RETURN(Shape want, layout_.ShapeOf(name, &owned));
  name_ = name;
  next_offset_ = 0;
  total_bytes_ = chunk.total_bytes();
  target_ = nullptr;
  if (!owned) return absl::OkStatus();
  const Shape got(chunk.shape().begin(), chunk.shape().end());
  if (got != want) {
    return Bad(name, absl::StrCat("shape ", ShapeToString(got),
                                  ", the stage's is ", ShapeToString(want)));
  }
  const int64_t bytes = NumElements(want) * static_cast<int64_t>(sizeof(float));
  if (chunk.total_bytes() != bytes) {
    return Bad(name, absl::StrCat("total_bytes ", chunk.total_bytes(),
                                  ", its shape needs ", bytes));
  }
  if (!seen_.insert(name).second) return Bad(name, "comes twice");
  if (kept_bytes_ + bytes > layout_.total_bytes()) {
    return Bad(name, absl::StrCat("the stream holds more than the stage's ",
                                  layout_.total_bytes(), " bytes of state"));
  }
  kept_bytes_ += bytes;
  target_ = &(state_.tensors[name] = Tensor::Host(want));
  return absl::OkStatus();
}

absl::Status StateAssembler::Add(const v1::StateChunk& chunk) {
  if (chunk.job_id() != job_id_) {
    return Bad(chunk.name(),
               absl::StrCat("a chunk of job ", Quoted(chunk.job_id()),
                            " in a stream for job ", Quoted(job_id_)));
  }
  RETURN_IF_ERROR(CheckScalars(chunk));
  const int64_t size = static_cast<int64_t>(chunk.data().size());
  if (chunk.offset() < 0 || chunk.total_bytes() < 0 ||
      chunk.offset() > chunk.total_bytes() ||
      size > chunk.total_bytes() - chunk.offset()) {
    return Bad(chunk.name(),
               absl::StrCat("bytes [", chunk.offset(), ", +", size,
                            ") outside its total_bytes ", chunk.total_bytes()));
  }
  const bool continues =
      !name_.empty() && chunk.name() == name_ && next_offset_ < total_bytes_;
  if (continues) {
    if (chunk.offset() != next_offset_ || chunk.total_bytes() != total_bytes_) {
      return Bad(name_,
                 absl::StrCat("a chunk at offset ", chunk.offset(), " of ",
                              chunk.total_bytes(), " bytes; expected offset ",
                              next_offset_, " of ", total_bytes_));
    }
  } else {
    RETURN_IF_ERROR(EndCurrent());
    RETURN_IF_ERROR(Begin(chunk));
  }
  if (target_ != nullptr && size > 0) {
    std::memcpy(static_cast<char*>(target_->raw()) + next_offset_,
                chunk.data().data(), static_cast<size_t>(size));
  }
  next_offset_ += size;
  return absl::OkStatus();
}

absl::StatusOr<TrainingState> StateAssembler::Finish() {
  RETURN_IF_ERROR(EndCurrent());
  return std::move(state_);
}

}  // namespace pipetrain
