#include "worker/pipeline/micro_batch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/compute/elementwise_math.h"

namespace pipetrain {

uint64_t MicroBatchSeed(uint64_t seed, int64_t step, int64_t micro_batch) {
  return math::SplitMix64(math::SplitMix64(seed ^ 0xd20d20ull) +
                          static_cast<uint64_t>(step) * 4096ull +
                          static_cast<uint64_t>(micro_batch));
}

absl::StatusOr<Tensor> ShapeInputs(const Tensor& inputs, const Shape& sample) {
  Shape shape = {inputs.dim(0)};
  shape.insert(shape.end(), sample.begin(), sample.end());
  if (NumElements(shape) != inputs.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the dataset's samples ", ShapeToString(inputs.shape()),
        " do not fit the model's input shape ", ShapeToString(sample)));
  }
  return inputs.Reshaped(shape);
}

std::vector<RowRange> EvalBatches(int64_t eval_size, int64_t max_samples,
                                  int64_t batch_size) {
  const int64_t n =
      max_samples > 0 ? std::min(max_samples, eval_size) : eval_size;
  std::vector<RowRange> out;
  if (batch_size <= 0) return out;
  for (int64_t begin = 0; begin < n; begin += batch_size) {
    out.push_back({begin, std::min(n, begin + batch_size)});
  }
  return out;
}

}  // namespace pipetrain
