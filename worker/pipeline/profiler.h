// Per-layer profiles on this worker's device: forward and backward time,
// the job's optimizer update of the layer's parameters, output activation
// bytes and parameter bytes. The planner uses them to cut
// the model into balanced stages.
#ifndef PIPETRAIN_WORKER_PIPELINE_PROFILER_H_
#define PIPETRAIN_WORKER_PIPELINE_PROFILER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "pipetrain/v1/job.pb.h"
#include "pipetrain/v1/stage.pb.h"
#include "worker/compute/backend.h"

namespace pipetrain {

// Times every layer of `spec.model` on `backend` for micro-batches of
// `batch` samples (default: batch_size / micro_batches), taking the median
// of `repetitions` runs (default 3) after one warm-up, or with `fastest`
// the fastest of `repetitions` rounds through the layers of one warm-up
// and one timed run each. With `reuse_weights` each layer runs as a
// synchronous stage with M > 1 runs it (ProfileRequest.reuse_weights): its
// products against weights laid out once, the layout remade after each
// update and counted in the optimizer's time, and its weight gradients
// taken over a step's micro-batches in one product, each micro-batch's
// share counted in its backward (Model::DeferWeightGrads). The last layer's
// forward time includes the loss and its gradient, which the stage holding it
// computes for every micro-batch.
//
// The layers are timed in place, not alone: a micro-batch runs forward
// through a chain of consecutive layers (with the loss after the model's
// last), backward through them in reverse and the optimizer over each
// layer's parameters, every layer's part timed where it runs. With more
// than one micro-batch a step (spec.micro_batches), the timed backward
// passes add to the gradients the step holds, as all but a step's first
// micro-batch do. The chains hold at most `max_chain_parameter_bytes` of
// parameters each (ProfileChains).
inline constexpr int64_t kMaxChainParameterBytes = int64_t{256} << 20;
absl::StatusOr<v1::ProfileResponse> ProfileLayers(
    const v1::TrainingSpec& spec, int64_t batch, int repetitions,
    Backend* backend, bool fastest = false, bool reuse_weights = false,
    int64_t max_chain_parameter_bytes = kMaxChainParameterBytes);

// The chains ProfileLayers builds one at a time, [begin, end) each, in
// order: as many consecutive layers as fit `max_parameter_bytes` of
// float32 parameters, a bigger layer alone. A worker need not hold the
// whole model to profile it. InvalidArgument for an invalid layer.
absl::StatusOr<std::vector<std::pair<int, int>>> ProfileChains(
    const v1::ModelSpec& model, int64_t max_parameter_bytes);

// Float32 GEMM speed of `backend` (GFLOP/s), from a few 512^3 products.
// Registration reports it so the planner can weigh workers against each
// other.
absl::StatusOr<double> MeasureGemmGflops(Backend* backend);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_PIPELINE_PROFILER_H_
