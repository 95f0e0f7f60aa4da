#include "worker/pipeline/stage_evaluation.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/pipeline/micro_batch.h"

namespace pipetrain {
namespace {

// One micro-batch of the pass on its way through the stage's chunks.
struct EvalPiece {
  Tensor activation;  // on the backend
  // Host; the last stage's own (read with the inputs on a one-stage
  // pipeline), never sent.
  Tensor labels;
  int64_t samples = 0;  // the size of the held-out split stage 0 reads
  bool last = false;    // the pass's last micro-batch
};

// One stage's part of one pass. Not thread-safe: lives on the stack of the
// thread holding the executor's compute lock.
class EvaluationPass {
 public:
  EvaluationPass(StageCompute* compute, int64_t pass)
      : compute_(compute), pass_(pass) {}

  absl::StatusOr<EvalStats> Run(int64_t max_samples);

 private:
  // Stage 0 and the last stage: the row ranges of the pass's
  // micro-batches.
  absl::StatusOr<std::vector<RowRange>> Plan(int64_t max_samples) const;
  absl::StatusOr<EvalPiece> Load(RowRange rows, bool last) const;
  absl::StatusOr<EvalPiece> Receive(int i, int chunk);
  absl::Status Send(int i, int chunk, const EvalPiece& piece) const;
  // The last stage: micro-batch i's loss against its labels (rows plan[i]
  // of its own held-out split).
  absl::Status Score(int i, const std::vector<RowRange>& plan,
                     EvalPiece* piece);
  // Runs micro-batch i through every chunk; returns whether it was the last.
  absl::StatusOr<bool> RunPiece(int i, const std::vector<RowRange>& plan);

  StageCompute* const compute_;  // borrowed
  const int64_t pass_;
  EvalStats stats_;
  double idle_seconds_ = 0.0;
};

absl::StatusOr<std::vector<RowRange>> EvaluationPass::Plan(
    int64_t max_samples) const {
  const int64_t rows = compute_->setup().rows_per_micro_batch;
  std::vector<RowRange> plan;
  for (const RowRange& batch :
       EvalBatches(compute_->data()->eval_size(), max_samples,
                   compute_->config().spec().batch_size())) {
    for (int64_t begin = batch.begin; begin < batch.end; begin += rows) {
      plan.push_back({begin, std::min(batch.end, begin + rows)});
    }
  }
  if (plan.empty()) {
    return absl::FailedPreconditionError(
        "the held-out split is empty: nothing to evaluate");
  }
  return plan;
}

absl::StatusOr<EvalPiece> EvaluationPass::Load(RowRange rows, bool last) const {
  ASSIGN_OR_RETURN(Batch batch, compute_->data()->EvalBatch(rows));
  EvalPiece piece;
  ASSIGN_OR_RETURN(piece.activation, compute_->OnBackend(batch.inputs));
  piece.labels = batch.labels;  // a one-stage pipeline's (else empty)
  piece.samples = compute_->data()->eval_size();
  piece.last = last;
  return piece;
}

absl::StatusOr<EvalPiece> EvaluationPass::Receive(int i, int chunk) {
  ASSIGN_OR_RETURN(StageMessage msg,
                   compute_->port()->Receive(MessageKind::kEvalActivation,
                                             pass_, i, chunk, &idle_seconds_));
  EvalPiece piece;
  ASSIGN_OR_RETURN(piece.activation, compute_->OnBackend(msg.tensors.at(0)));
  piece.samples = msg.samples;
  piece.last = msg.value != 0.0;
  return piece;
}

absl::Status EvaluationPass::Send(int i, int chunk,
                                  const EvalPiece& piece) const {
  StageMessage msg;
  msg.kind = MessageKind::kEvalActivation;
  msg.step = pass_;
  msg.micro_batch = i;
  msg.chunk = compute_->DownstreamChunk(chunk);
  msg.weight_version = compute_->weight_version();
  msg.value = piece.last ? 1.0 : 0.0;
  msg.samples = piece.samples;
  ASSIGN_OR_RETURN(Tensor activation, compute_->HostCopy(piece.activation));
  msg.tensors = {activation};
  return compute_->port()->SendDownstream(std::move(msg));
}

absl::Status EvaluationPass::Score(int i, const std::vector<RowRange>& plan,
                                   EvalPiece* piece) {
  if (piece->labels.empty()) {
    RETURN_IF_ERROR(
        compute_->data()->CheckUpstreamSize(piece->samples, /*eval=*/true));
    const size_t index = static_cast<size_t>(i);
    // Equal splits give stage 0 the same plan; this holds unless the
    // stages were asked for different passes.
    if (index >= plan.size() || piece->last != (index + 1 == plan.size()) ||
        plan[index].rows() != piece->activation.dim(0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage 0's micro-batch of ", piece->activation.dim(0), " rows",
          piece->last ? " (its last)" : "", " is not this stage's ",
          index < plan.size() ? absl::StrCat(plan[index].rows(), " rows")
                              : std::string("(past its last)"),
          " of the pass's ", plan.size(), " micro-batches"));
    }
    ASSIGN_OR_RETURN(Batch batch, compute_->data()->EvalBatch(plan[index]));
    piece->labels = batch.labels;
  }
  ASSIGN_OR_RETURN(Tensor labels, ToDevice(compute_->backend(), piece->labels));
  ASSIGN_OR_RETURN(LossStats s, compute_->loss()->Forward(piece->activation,
                                                          labels, nullptr));
  stats_.loss.Add(s);
  stats_.samples += piece->labels.dim(0);
  return absl::OkStatus();
}

absl::StatusOr<bool> EvaluationPass::RunPiece(
    int i, const std::vector<RowRange>& plan) {
  ForwardOptions options;
  options.training = false;
  EvalPiece piece;
  for (int c = 0; c < compute_->num_chunks(); ++c) {
    if (compute_->IsFirstVirtual(c)) {
      ASSIGN_OR_RETURN(
          piece, Load(plan[i], static_cast<size_t>(i) + 1 == plan.size()));
    } else {
      ASSIGN_OR_RETURN(piece, Receive(i, c));
    }
    ASSIGN_OR_RETURN(piece.activation, compute_->models()[c]->Forward(
                                           piece.activation, options, nullptr));
    if (compute_->IsLastVirtual(c)) {
      RETURN_IF_ERROR(Score(i, plan, &piece));
    } else {
      RETURN_IF_ERROR(Send(i, c, piece));
    }
  }
  return piece.last;
}

absl::StatusOr<EvalStats> EvaluationPass::Run(int64_t max_samples) {
  std::vector<RowRange> plan;
  if (compute_->data() != nullptr) {
    ASSIGN_OR_RETURN(plan, Plan(max_samples));
  }
  bool last = false;
  for (int i = 0; !last; ++i) {
    absl::StatusOr<bool> done = RunPiece(i, plan);
    if (!done.ok()) {
      return absl::Status(
          done.status().code(),
          absl::StrCat("evaluation pass ", pass_, ", micro-batch ", i, ": ",
                       done.status().message()));
    }
    last = *done;
  }
  return stats_;
}

}  // namespace

absl::StatusOr<EvalStats> RunEvaluationPass(StageCompute* compute, int64_t pass,
                                            int64_t max_samples) {
  EvaluationPass evaluation(compute, pass);
  return evaluation.Run(max_samples);
}

}  // namespace pipetrain
