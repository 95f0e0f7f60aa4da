// Fashion-MNIST (Xiao, Rasul and Vollgraf, 2017) read from its IDX files.
//
// A split is a pair of files, <prefix>-images-idx3-ubyte and
// <prefix>-labels-idx1-ubyte, each gzip-compressed (".gz") or plain; "train"
// is the train split and "t10k" the evaluation split. Samples are the 28x28
// images flattened to [784] floats, scaled to [0, 1] and normalized with the
// training set's mean and standard deviation; labels are class ids 0..9.
#ifndef PIPETRAIN_WORKER_DATA_FASHION_MNIST_H_
#define PIPETRAIN_WORKER_DATA_FASHION_MNIST_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "pipetrain/v1/job.pb.h"
#include "worker/data/dataset.h"

namespace pipetrain {

// Where Debian's package dataset-fashion-mnist installs the files; used when
// FashionMnistSource.dir is empty.
inline constexpr char kDefaultFashionMnistDir[] =
    "/usr/share/datasets/fashion-mnist";

inline constexpr int64_t kFashionMnistRows = 28;
inline constexpr int64_t kFashionMnistCols = 28;
inline constexpr int64_t kFashionMnistClasses = 10;
// Pixel statistics of the training set after scaling to [0, 1].
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

// IDX magic numbers (big-endian): unsigned bytes in 3 or 1 dimensions.
inline constexpr uint32_t kIdxImagesMagic = 0x00000803;
inline constexpr uint32_t kIdxLabelsMagic = 0x00000801;

// The file name prefixes of the two splits.
inline constexpr char kFashionMnistTrainPrefix[] = "train";
inline constexpr char kFashionMnistEvalPrefix[] = "t10k";

// The two files of a split.
enum FashionMnistFile { kImagesFile, kLabelsFile };

// The path of a split's images or labels file in `dir`:
// "<prefix>-images-idx3-ubyte" or "<prefix>-labels-idx1-ubyte", with ".gz"
// when that exists, else plain; NotFound naming both when neither does.
absl::StatusOr<std::string> FindFashionMnistFile(const std::string& dir,
                                                 const std::string& prefix,
                                                 FashionMnistFile file);

// Loads one split from an images file and a labels file (gzip or plain),
// reading only the images for inputs and only the labels for labels (the
// other path is not opened and may be empty). NotFound when a file is
// missing; InvalidArgument for a wrong magic number; DataLoss for wrong
// image dimensions, mismatched counts (both parts), an empty file, labels
// outside 0..9 or files shorter than their headers promise. Messages name
// the file.
absl::StatusOr<std::unique_ptr<Dataset>> LoadFashionMnistSplit(
    const std::string& images_path, const std::string& labels_path,
    DataParts parts = kAllDataParts);

// Opens the train ("train-*") and evaluation ("t10k-*") splits from
// source.dir, or kDefaultFashionMnistDir when it is empty: for `parts`,
// only the images files, only the labels files, or both.
absl::StatusOr<DatasetPair> OpenFashionMnist(
    const v1::FashionMnistSource& source, DataParts parts = kAllDataParts);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_DATA_FASHION_MNIST_H_
