// Datasets read from NumPy .npy files (data.numpy): features [N, ...] of
// float32 or uint8 and labels [N] of integer class ids, memory-mapped
// (mapped_file.h) so a sample costs only the pages it lies on. A reader of
// one part maps only that part's files.
//
// An input element is (feature * scale - mean) / std in float32, with
// scale 1 and std 1 where the spec leaves them 0 (float32 features; uint8
// features need a scale). Labels are checked once at open to lie in
// 0..classes-1.
#ifndef PIPETRAIN_WORKER_DATA_NUMPY_DATASET_H_
#define PIPETRAIN_WORKER_DATA_NUMPY_DATASET_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "pipetrain/v1/job.pb.h"
#include "worker/data/dataset.h"
#include "worker/data/mapped_file.h"
#include "worker/data/npy_header.h"

namespace pipetrain {

// A mapped .npy file and its parsed header. Immutable; thread-safe.
struct NpyArray {
  std::unique_ptr<MappedFile> file;
  NpyHeader header;
  const uint8_t* data() const { return file->data() + header.data_offset; }
};

// Maps `path` and parses its header; errors name `field` and the path.
absl::StatusOr<NpyArray> OpenNpyArray(const std::string& path,
                                      const std::string& field);

// Loads one split: for `parts`, the features file only, the labels file
// only, or both (then checked to hold as many samples). Errors name the
// field and file: InvalidArgument for a dtype or rank the dataset cannot
// use, a uint8 file without a scale, or features and labels of different
// lengths; DataLoss for a label outside 0..classes-1 (with its sample
// index) and for malformed files.
absl::StatusOr<std::unique_ptr<Dataset>> LoadNumpySplit(
    const v1::NumpySource& source, const std::string& features_path,
    const std::string& labels_path, const std::string& split,
    DataParts parts = kAllDataParts);

// Validates the source's fields (spec/dataset_spec.h) and loads the train
// and eval splits' files of `parts`.
absl::StatusOr<DatasetPair> OpenNumpy(const v1::NumpySource& source,
                                      DataParts parts = kAllDataParts);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_DATA_NUMPY_DATASET_H_
