#include "worker/pipeline/incoming_check.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/pipeline/stage_state.h"

namespace pipetrain {
namespace {

absl::Status CheckTensor(const Tensor& t, const Shape& want, const char* what) {
  if (t.shape() != want || t.dtype() != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": expected ", DTypeName(DType::kF32), ShapeToString(want),
        ", got ", DTypeName(t.dtype()), ShapeToString(t.shape())));
  }
  return absl::OkStatus();
}

Shape Rows(int64_t rows, const Shape& sample) {
  Shape out = {rows};
  out.insert(out.end(), sample.begin(), sample.end());
  return out;
}

absl::Status CheckWindow(int64_t step, StepWindow window, const char* what) {
  if (step < window.low || step >= window.high) {
    return absl::InvalidArgumentError(absl::StrCat("unknown ", what, " ", step,
                                                   " (expecting [", window.low,
                                                   ", ", window.high, "))"));
  }
  return absl::OkStatus();
}

}  // namespace

IncomingCheck::IncomingCheck(const StageSetup& setup, bool first, bool last,
                             std::vector<Shape> chunk_inputs,
                             std::vector<Shape> chunk_outputs)
    : micro_batches_(setup.params.micro_batches),
      rows_(setup.rows_per_micro_batch),
      first_(first),
      last_(last),
      chunk_inputs_(std::move(chunk_inputs)),
      chunk_outputs_(std::move(chunk_outputs)) {}

absl::Status IncomingCheck::Check(const StageMessage& msg, StepWindow steps,
                                  StepWindow passes) const {
  const bool evaluation = msg.kind == MessageKind::kEvalActivation;
  if (evaluation) {
    RETURN_IF_ERROR(CheckWindow(msg.step, passes, "evaluation pass"));
  } else {
    RETURN_IF_ERROR(CheckWindow(msg.step, steps, "step"));
  }
  // An evaluation pass numbers its micro-batches on, past M.
  if (msg.micro_batch < 0 ||
      (!evaluation && msg.micro_batch >= micro_batches_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown micro-batch ", msg.micro_batch,
                     " (M = ", micro_batches_, ")"));
  }
  if (msg.chunk < 0 || msg.chunk >= static_cast<int>(chunk_inputs_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("unknown chunk ", msg.chunk,
                                                   " (", chunk_inputs_.size(),
                                                   " on this stage)"));
  }
  switch (msg.kind) {
    case MessageKind::kActivation:
    case MessageKind::kEvalActivation: {
      // An evaluation pass's last micro-batch may be short.
      const int64_t rows =
          evaluation && !msg.tensors.empty() && msg.tensors[0].rank() > 0
              ? msg.tensors[0].dim(0)
              : rows_;
      if (rows < 1 || rows > rows_) {
        return absl::InvalidArgumentError(absl::StrCat(
            "an evaluation activation of ", rows, " rows (1 to ", rows_, ")"));
      }
      return CheckActivation(msg, rows);
    }
    case MessageKind::kGradient:
      return CheckGradient(msg);
    case MessageKind::kNormPartial:
    case MessageKind::kNormTotal:
      if (!msg.tensors.empty()) {
        return absl::InvalidArgumentError("norm messages carry no tensors");
      }
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError("unknown message kind");
}

absl::Status IncomingCheck::CheckActivation(const StageMessage& msg,
                                            int64_t rows) const {
  if (IsFirstVirtual(msg.chunk)) {
    return absl::InvalidArgumentError("stage 0 takes no activations");
  }
  if (msg.tensors.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("an activation carries 1 tensor (no labels), got ",
                     msg.tensors.size()));
  }
  if (msg.samples <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("an activation names a split of ", msg.samples,
                     " samples (stage 0's, at least 1)"));
  }
  const bool evaluation = msg.kind == MessageKind::kEvalActivation;
  const double v = msg.value;
  const bool known_end =
      evaluation ? (v == 0.0 || v == 1.0)
                 : (v == static_cast<int>(StepEnd::kContinue) ||
                    v == static_cast<int>(StepEnd::kEndRun) ||
                    v == static_cast<int>(StepEnd::kDrainForEvaluation));
  if (!known_end) {
    return absl::InvalidArgumentError(
        absl::StrCat("an activation marked ", v, " (unknown)"));
  }
  return CheckTensor(msg.tensors[0], Rows(rows, chunk_inputs_[msg.chunk]),
                     "activation");
}

absl::Status IncomingCheck::CheckGradient(const StageMessage& msg) const {
  if (IsLastVirtual(msg.chunk)) {
    return absl::InvalidArgumentError("the last stage takes no gradients");
  }
  if (msg.tensors.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a gradient carries 1 tensor, got ", msg.tensors.size()));
  }
  return CheckTensor(msg.tensors[0], Rows(rows_, chunk_outputs_[msg.chunk]),
                     "gradient");
}

}  // namespace pipetrain
