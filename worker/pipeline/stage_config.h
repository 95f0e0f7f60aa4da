// Decoding a StageConfig: everything a stage executor derives from its
// config, validated once, before anything is built. InvalidArgument naming
// the field for a bad config.
#ifndef PIPETRAIN_WORKER_PIPELINE_STAGE_CONFIG_H_
#define PIPETRAIN_WORKER_PIPELINE_STAGE_CONFIG_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "pipetrain/v1/stage.pb.h"
#include "spec/schedule.h"
#include "spec/vocabulary.h"
#include "worker/compute/tensor.h"
#include "worker/data/dataset.h"

namespace pipetrain {

// Layers [begin, end) of a model: one chunk of a stage.
struct LayerSpan {
  int begin = 0;
  int end = 0;
};

// What a stage is, decoded from its StageConfig.
struct StageSetup {
  // The schedule of one self-contained window (kind, K, M, v).
  ScheduleParams params;
  // Synchronous schedules: the stream every step runs. (Cross-step streams
  // are built per step; building this one validated the parameters.)
  std::vector<Instruction> schedule;
  bool cross_step = false;  // 1F1B-async, 2BW
  bool two_bw = false;
  // 1F1B-async: each micro-batch is its own update (loss scale 1 / rows).
  bool per_micro_batch_update = false;
  int lookback = 0;  // steps back a stream reaches (StepLookback)
  // The model chunks (virtual stages) on this stage, in chunk order.
  std::vector<LayerSpan> spans;
  int64_t rows_per_micro_batch = 0;
  // config.initial_weights as host float32 tensors; empty means the seeded
  // initialization.
  std::vector<Tensor> initial_weights;
};

// Validates `config` (job, stage index, neighbours, schedule, chunks, wire
// dtype, initial weights, and the options the schedule does not allow) and
// decodes it.
absl::StatusOr<StageSetup> DecodeStageConfig(const v1::StageConfig& config);

// What a stage reads of its job's data: stage 0 (which holds model stage 0)
// the inputs, the last stage (which holds the last model stage, also under
// the interleaved schedule) the labels, a one-stage pipeline both, the
// others nothing.
DataParts StageDataParts(const v1::StageConfig& config);

// Everything a worker can check about `config` without building it: the
// decode above, the layer ranges against the model, and the files of the
// dataset parts the stage reads (StageDataParts) against the data access
// policy. A worker runs this
// before it touches a running stage, so a rejected config leaves the
// running job as it was.
absl::Status ValidateStageConfig(const v1::StageConfig& config);

// The layer ranges of a stage's model chunks: config.chunks for the
// interleaved schedule, else the one [layer_begin, layer_end).
absl::StatusOr<std::vector<LayerSpan>> ChunkSpans(
    const v1::StageConfig& config);

// config.initial_weights as host float32 tensors.
absl::StatusOr<std::vector<Tensor>> DecodeInitialWeights(
    const v1::StageConfig& config);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_PIPELINE_STAGE_CONFIG_H_
