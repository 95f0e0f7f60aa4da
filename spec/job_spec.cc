#include "spec/job_spec.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "spec/training_spec.h"
#include "spec/vocabulary.h"

namespace pipetrain {
namespace {

constexpr int kDefaultVirtualStages = 2;

int64_t MicroBatches(const v1::JobSpec& spec) {
  return std::max<int64_t>(1, spec.training().micro_batches());
}

absl::Status Invalid(const char* field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("spec.", field, ": ", what));
}

// The interleaved schedule's own rules on top of the general ones.
absl::Status ValidateInterleaving(const v1::JobSpec& spec) {
  const int v =
      spec.virtual_stages() > 0 ? spec.virtual_stages() : kDefaultVirtualStages;
  if (v < 2) {
    return Invalid("virtual_stages",
                   "interleaving needs at least 2 chunks per worker");
  }
  const int k = spec.num_stages();
  const int64_t m = MicroBatches(spec);
  // In 64 bits: k x v overflows an int for a large virtual_stages.
  const int64_t chunks = int64_t{k} * v;
  if (k > 0 && (m % k != 0 || spec.training().model().layers_size() < chunks)) {
    return Invalid("num_stages",
                   absl::StrCat("interleaving ", k, " workers x ", v,
                                " chunks needs micro_batches divisible by ", k,
                                " and at least ", chunks, " layers"));
  }
  return absl::OkStatus();
}

// The options that belong to one schedule only.
absl::Status ValidateScheduleOptions(const v1::JobSpec& spec,
                                     ScheduleKind kind) {
  if (spec.vertical_sync() && kind != ScheduleKind::kOneFOneBAsync) {
    return Invalid("vertical_sync", "only applies to SCHEDULE_ASYNC_1F1B");
  }
  if (spec.extra_warmup() < kAutoExtraWarmup ||
      spec.extra_warmup() > kMaxExtraWarmup) {
    return Invalid("extra_warmup",
                   absl::StrCat(spec.extra_warmup(), " must be in [0, ",
                                kMaxExtraWarmup, "], or -1 (auto)"));
  }
  if (spec.extra_warmup() != 0 && !IsCrossStep(kind)) {
    return Invalid("extra_warmup",
                   "only applies to SCHEDULE_2BW and SCHEDULE_ASYNC_1F1B (the "
                   "other schedules drain every step)");
  }
  if (kind == ScheduleKind::kInterleaved) {
    RETURN_IF_ERROR(ValidateInterleaving(spec));
  } else if (spec.virtual_stages() > 1) {
    return Invalid("virtual_stages", "only applies to SCHEDULE_INTERLEAVED");
  }
  if (IsCrossStep(kind) && spec.training().optimizer().clip_grad_norm() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.optimizer.clip_grad_norm: not supported with ",
                     v1::ScheduleKindProto_Name(spec.schedule())));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::JobSpec> ParseJobSpecJson(const std::string& json) {
  v1::JobSpec job;
  const absl::Status as_job = ParseJson(json, &job);
  if (as_job.ok() && job.has_training()) return job;
  v1::TrainingSpec training;
  const absl::Status as_training = ParseJson(json, &training);
  if (as_training.ok()) {
    // A JobSpec without `training` that also parses as a TrainingSpec can
    // only be "{}"; either reading gives the same (empty) job.
    v1::JobSpec wrapped;
    *wrapped.mutable_training() = std::move(training);
    return wrapped;
  }
  if (as_job.ok()) {
    return absl::InvalidArgumentError(
        "the JobSpec has no `training` (the model, data and optimizer)");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("neither a JobSpec nor a TrainingSpec: ", as_job.message(),
                   "; ", as_training.message()));
}

absl::StatusOr<ScheduleParams> JobScheduleParams(const v1::JobSpec& spec,
                                                 int num_stages) {
  if (num_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_stages: ", num_stages, " must be >= 1"));
  }
  ScheduleParams params;
  ASSIGN_OR_RETURN(params.kind, ScheduleKindFromProto(spec.schedule()));
  params.num_stages = num_stages;
  params.micro_batches = static_cast<int>(MicroBatches(spec));
  // Auto (-1) is the planner's to choose; the stage count's checks use 0.
  params.extra_warmup = std::max(0, spec.extra_warmup());
  if (params.kind == ScheduleKind::kInterleaved) {
    params.virtual_stages = spec.virtual_stages() > 0 ? spec.virtual_stages()
                                                      : kDefaultVirtualStages;
  }
  return params;
}

absl::Status ValidateJobSpec(const v1::JobSpec& spec) {
  if (!spec.has_training()) return Invalid("training", "missing");
  RETURN_IF_ERROR(ValidateTrainingSpec(spec.training()));
  const int layers = spec.training().model().layers_size();
  if (spec.num_stages() < 0) return Invalid("num_stages", "must be >= 0");
  if (spec.num_stages() > layers) {
    return Invalid("num_stages",
                   absl::StrCat(spec.num_stages(), " stages for a model of ",
                                layers, " layers"));
  }
  absl::StatusOr<ScheduleKind> kind = ScheduleKindFromProto(spec.schedule());
  if (!kind.ok()) return Invalid("schedule", kind.status().message());
  const absl::StatusOr<DType> wire = DTypeFromProto(spec.wire_dtype());
  if (!wire.ok()) return Invalid("wire_dtype", wire.status().message());
  RETURN_IF_ERROR(ValidateWireCompression(spec.wire_compression(),
                                          "spec.wire_compression"));
  if (spec.eval_samples() < 0) {
    return Invalid("eval_samples",
                   absl::StrCat(spec.eval_samples(), " must be >= 0 (0: all)"));
  }
  RETURN_IF_ERROR(ValidateScheduleOptions(spec, *kind));
  if (spec.num_stages() > 0) {
    ASSIGN_OR_RETURN(ScheduleParams params,
                     JobScheduleParams(spec, spec.num_stages()));
    const absl::Status buildable = BuildSchedule(params, 0).status();
    if (!buildable.ok()) return Invalid("schedule", buildable.message());
  }
  return absl::OkStatus();
}

absl::StatusOr<double> JobTheoreticalBubble(const v1::JobSpec& spec,
                                            int num_stages) {
  ASSIGN_OR_RETURN(ScheduleParams params, JobScheduleParams(spec, num_stages));
  return TheoreticalBubble(params, SimCosts());
}

}  // namespace pipetrain
