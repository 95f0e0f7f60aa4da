// Field rules of the dataset sources that read users' files (data.numpy,
// data.token_shards), checked at submit by ValidateTrainingSpec and again
// by the worker before it opens anything. What the files hold (dtypes,
// shapes, label and token ranges) only the worker that maps them can check
// (worker/data/numpy_dataset.h, token_shards.h).
#ifndef PIPETRAIN_SPEC_DATASET_SPEC_H_
#define PIPETRAIN_SPEC_DATASET_SPEC_H_

#include <cstdint>

#include "absl/status/status.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain {

// Class ids and token ids travel as exact floats: at most 2^24 of them.
inline constexpr int64_t kMaxDatasetClasses = int64_t{1} << 24;

// InvalidArgument naming the field: a missing path, a token file that is
// neither ".bin" nor ".npy", classes / vocab_size / seq_len out of range,
// a scale, mean or std that is not finite (or a negative std or scale).
absl::Status ValidateNumpySource(const v1::NumpySource& source);
absl::Status ValidateTokenShardSource(const v1::TokenShardSource& source);

// The fields of whichever of the two sources `data` holds; OK for others.
absl::Status ValidateDatasetSpec(const v1::DatasetSpec& data);

// The source against the model: classes (vocab_size) equal to the model's
// output width, and a token window of the model's input length. OK for the
// other sources and for models whose shapes do not check (reported by the
// model's own validation).
absl::Status ValidateDatasetFitsModel(const v1::TrainingSpec& spec);

}  // namespace pipetrain

#endif  // PIPETRAIN_SPEC_DATASET_SPEC_H_
