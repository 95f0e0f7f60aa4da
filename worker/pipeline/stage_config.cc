#include "worker/pipeline/stage_config.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spec/training_spec.h"
#include "spec/vocabulary.h"
#include "worker/data/data_access.h"
#include "worker/nn/model.h"

namespace pipetrain {
namespace {

// The stage's place in the pipeline and its links.
absl::Status CheckPlace(const v1::StageConfig& config) {
  if (config.job_id().empty()) {
    return absl::InvalidArgumentError("config.job_id: missing");
  }
  if (config.num_stages() < 1 || config.stage() < 0 ||
      config.stage() >= config.num_stages()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.stage: ", config.stage(), " is not in [0, ",
                     config.num_stages(), ")"));
  }
  const bool last = config.stage() == config.num_stages() - 1;
  if (!last && config.downstream().empty()) {
    return absl::InvalidArgumentError(
        "config.downstream: every stage but the last needs its neighbour");
  }
  if (config.schedule() == v1::SCHEDULE_INTERLEAVED &&
      config.downstream().empty()) {
    return absl::InvalidArgumentError(
        "config.downstream: interleaved: the last worker needs worker 0 (the "
        "wrap-around link)");
  }
  if (config.start_step() < 0) {
    return absl::InvalidArgumentError("config.start_step: must be >= 0");
  }
  return absl::OkStatus();
}

// The options only some schedules allow, and the wire format.
absl::Status CheckOptions(const v1::StageConfig& config, ScheduleKind kind) {
  if (IsCrossStep(kind) && config.spec().optimizer().clip_grad_norm() > 0) {
    // A global norm would make every update wait for every stage.
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.clip_grad_norm: not supported with ",
                     v1::ScheduleKindProto_Name(config.schedule())));
  }
  if (config.vertical_sync() && kind != ScheduleKind::kOneFOneBAsync) {
    return absl::InvalidArgumentError(
        "config.vertical_sync: only applies to SCHEDULE_ASYNC_1F1B");
  }
  if (absl::Status wire = DTypeFromProto(config.wire_dtype()).status();
      !wire.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.wire_dtype: ", wire.message()));
  }
  RETURN_IF_ERROR(ValidateWireCompression(config.wire_compression(),
                                          "config.wire_compression"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<LayerSpan>> ChunkSpans(
    const v1::StageConfig& config) {
  if (config.schedule() != v1::SCHEDULE_INTERLEAVED) {
    if (config.chunks_size() > 0 || config.virtual_stages() > 1) {
      return absl::InvalidArgumentError(
          "config.chunks / config.virtual_stages: only for "
          "SCHEDULE_INTERLEAVED");
    }
    return std::vector<LayerSpan>{{config.layer_begin(), config.layer_end()}};
  }
  if (config.virtual_stages() < 2 ||
      config.chunks_size() != config.virtual_stages()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.chunks: interleaved needs virtual_stages >= 2 chunks, got ",
        config.chunks_size(), " chunks and virtual_stages ",
        config.virtual_stages()));
  }
  std::vector<LayerSpan> spans;
  for (const v1::LayerRange& range : config.chunks()) {
    if (range.begin() >= range.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.chunks[", spans.size(), "]: [", range.begin(),
                       ", ", range.end(), ") is empty"));
    }
    spans.push_back({range.begin(), range.end()});
  }
  return spans;
}

absl::StatusOr<std::vector<Tensor>> DecodeInitialWeights(
    const v1::StageConfig& config) {
  std::vector<Tensor> weights;
  for (const v1::TensorProto& t : config.initial_weights()) {
    const Shape shape(t.shape().begin(), t.shape().end());
    for (int64_t d : shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "config.initial_weights: ", t.name(), " has a negative dimension"));
      }
    }
    const std::optional<int64_t> n = CheckedNumElements(shape);
    if (t.dtype() != v1::DTYPE_F32 || !n.has_value() ||
        CheckedMul(*n, sizeof(float)) !=
            std::optional<int64_t>(static_cast<int64_t>(t.data().size()))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.initial_weights: ", t.name(),
          " must be float32 with as many bytes as its shape needs"));
    }
    ASSIGN_OR_RETURN(Tensor host, Tensor::TryHost(shape));
    std::copy(t.data().begin(), t.data().end(), static_cast<char*>(host.raw()));
    weights.push_back(host);
  }
  return weights;
}

absl::StatusOr<StageSetup> DecodeStageConfig(const v1::StageConfig& config) {
  const v1::TrainingSpec& spec = config.spec();
  RETURN_IF_ERROR(ValidateTrainingSpec(spec));
  RETURN_IF_ERROR(CheckPlace(config));
  ASSIGN_OR_RETURN(std::vector<Shape> shapes, ValidateModelSpec(spec.model()));
  StageSetup setup;
  const int64_t m = std::max<int64_t>(1, spec.micro_batches());
  setup.rows_per_micro_batch = spec.batch_size() / m;
  ScheduleParams& params = setup.params;
  ASSIGN_OR_RETURN(params.kind, ScheduleKindFromProto(config.schedule()));
  RETURN_IF_ERROR(CheckOptions(config, params.kind));
  params.num_stages = config.num_stages();
  params.micro_batches = static_cast<int>(m);
  params.extra_warmup = config.extra_warmup();
  ASSIGN_OR_RETURN(setup.spans, ChunkSpans(config));
  params.virtual_stages = static_cast<int>(setup.spans.size());
  ASSIGN_OR_RETURN(setup.schedule, BuildSchedule(params, config.stage()));
  setup.cross_step = IsCrossStep(params.kind);
  setup.two_bw = params.kind == ScheduleKind::kTwoBW;
  setup.per_micro_batch_update = params.kind == ScheduleKind::kOneFOneBAsync;
  setup.lookback = StepLookback(params, config.stage());
  if (config.restore_expected() && config.initial_weights_size() > 0) {
    return absl::InvalidArgumentError(
        "config.initial_weights: not with restore_expected (the weights come "
        "from RestoreState)");
  }
  ASSIGN_OR_RETURN(setup.initial_weights, DecodeInitialWeights(config));
  return setup;
}

absl::Status ValidateStageConfig(const v1::StageConfig& config) {
  ASSIGN_OR_RETURN(const StageSetup setup, DecodeStageConfig(config));
  const int layers = config.spec().model().layers_size();
  for (const LayerSpan& span : setup.spans) {
    if (span.begin < 0 || span.begin >= span.end || span.end > layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.layer_begin / layer_end: [", span.begin, ", ", span.end,
          ") is not a layer range of the model's ", layers, " layers"));
    }
  }
  return CheckDatasetFiles(config.spec().data(), StageDataParts(config));
}

DataParts StageDataParts(const v1::StageConfig& config) {
  return {config.stage() == 0, config.stage() == config.num_stages() - 1};
}

}  // namespace pipetrain
