// A synthetic classification task for tests and benchmarks.
//
// Sample i of a split has `features` standard-normal features that are a
// pure function of (seed, split, i), computed on demand rather than stored.
// Its label is the argmax over classes of a fixed random linear teacher
// W[classes, features] (a pure function of the seed) applied to the
// features, so a linear model can learn the task exactly.
#ifndef PIPETRAIN_WORKER_DATA_SYNTHETIC_H_
#define PIPETRAIN_WORKER_DATA_SYNTHETIC_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "pipetrain/v1/job.pb.h"
#include "worker/data/dataset.h"

namespace pipetrain {

// The largest teacher (classes * features weights) OpenSynthetic accepts.
inline constexpr int64_t kMaxSyntheticTeacherWeights = int64_t{1} << 26;

// InvalidArgument naming the field (data.synthetic.features, .classes,
// .train_samples, .eval_samples) when features or a sample count is not
// positive, classes is below 2, or the teacher would exceed
// kMaxSyntheticTeacherWeights.
absl::StatusOr<DatasetPair> OpenSynthetic(const v1::SyntheticSource& source,
                                          uint64_t seed);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_DATA_SYNTHETIC_H_
