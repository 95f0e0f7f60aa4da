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

// Standard-normal values that are a pure function of (seed, index i), for
// i in [0, count), written to out: Box-Muller on the counter-based uniforms
// u1 = 1 - UniformAt(seed, 2j) and u2 = UniformAt(seed, 2j + 1), value 2j
// being sqrt(-2 ln u1) cos(2 pi u2) and value 2j + 1 the same with sin.
// Float polynomials stand in for log, cos and sin (within 1e-6 of the
// double-precision values), so a loop of them vectorizes. A stage that reads
// labels alone generates its samples' features too (a label is the
// teacher's class for them); with libm's double log and cos, one value at a
// time, a 784-feature sample took 24 us and its label 30 us, now 2.7 and
// 3.4 us (one core; 256-sample steps of the MLP in bench_scaling spent 6
// and 8 ms of CPU on them). The features and the teacher come from here.
void SyntheticGaussians(uint64_t seed, int64_t count, float* out);

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
