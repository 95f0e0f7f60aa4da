// How a job's samples are cut into the pieces the model sees, shared by the
// in-process trainer and the pipeline stages so both see the same pieces:
// dropout seeds per micro-batch, the input shape, and the batches of an
// evaluation pass.
#ifndef PIPETRAIN_WORKER_PIPELINE_MICRO_BATCH_H_
#define PIPETRAIN_WORKER_PIPELINE_MICRO_BATCH_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/compute/tensor.h"

namespace pipetrain {

// The dropout seed of one micro-batch of one step; every stage of a
// pipeline uses the same so their masks match the reference.
uint64_t MicroBatchSeed(uint64_t seed, int64_t step, int64_t micro_batch);

// Reshapes a host batch's inputs to [B, model input shape...].
absl::StatusOr<Tensor> ShapeInputs(const Tensor& inputs, const Shape& sample);

// Rows [begin, end) of a dataset split.
struct RowRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t rows() const { return end - begin; }
};

// The batches an evaluation reads: the first min(max_samples, eval_size)
// samples of the held-out split (all of them when max_samples is 0), in
// order, in batches of batch_size rows (the last one may be shorter).
std::vector<RowRange> EvalBatches(int64_t eval_size, int64_t max_samples,
                                  int64_t batch_size);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_PIPELINE_MICRO_BATCH_H_
