#include "worker/data/fashion_mnist.h"

#include <array>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "worker/data/byte_file.h"

namespace pipetrain {
namespace {

constexpr int64_t kPixels = kFashionMnistRows * kFashionMnistCols;

uint32_t BigEndianU32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Reads an IDX header: the magic number, checked first so that a file of
// the wrong kind is reported as such, then `dims` big-endian sizes.
absl::StatusOr<std::vector<uint32_t>> ReadIdxHeader(ByteFile& file,
                                                    uint32_t expected_magic,
                                                    absl::string_view kind,
                                                    int dims) {
  std::vector<uint8_t> bytes;
  RETURN_IF_ERROR(file.ReadExactly(4, "IDX magic number", &bytes));
  const uint32_t magic = BigEndianU32(bytes.data());
  if (magic != expected_magic) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s is not an IDX %s file: magic number 0x%08x, expected 0x%08x",
        file.path(), kind, magic, expected_magic));
  }
  RETURN_IF_ERROR(file.ReadExactly(4 * dims, "IDX header", &bytes));
  std::vector<uint32_t> sizes;
  for (int d = 0; d < dims; ++d) {
    sizes.push_back(BigEndianU32(&bytes[4 + 4 * d]));
  }
  return sizes;
}

// Immutable after construction; GetInput and GetLabel are thread-safe.
// Opened for one part, it holds that part only (the other vector empty).
class FashionMnistDataset final : public Dataset {
 public:
  FashionMnistDataset(int64_t size, DataParts parts,
                      std::vector<uint8_t> pixels, std::vector<uint8_t> labels)
      : size_(size),
        parts_(parts),
        pixels_(std::move(pixels)),
        labels_(std::move(labels)) {
    for (int v = 0; v < 256; ++v) {
      const float scaled = static_cast<float>(v) / 255.0f;
      pixel_to_input_[v] = (scaled - kFashionMnistMean) / kFashionMnistStd;
    }
  }

  int64_t size() const override { return size_; }
  Shape sample_shape() const override { return {kPixels}; }
  Shape label_shape() const override { return {}; }
  int64_t num_classes() const override { return kFashionMnistClasses; }
  DataParts parts() const override { return parts_; }

  void GetInput(int64_t index, float* input) const override {
    const uint8_t* image = pixels_.data() + index * kPixels;
    for (int64_t p = 0; p < kPixels; ++p) input[p] = pixel_to_input_[image[p]];
  }
  void GetLabel(int64_t index, float* label) const override {
    label[0] = static_cast<float>(labels_[index]);
  }

 private:
  // Constant after construction.
  const int64_t size_;
  const DataParts parts_;
  const std::vector<uint8_t> pixels_;  // [size, 28 * 28], row-major
  const std::vector<uint8_t> labels_;  // [size]
  std::array<float, 256> pixel_to_input_;
};

// Reads the images file: its header, checked, then all pixels.
absl::StatusOr<std::vector<uint8_t>> ReadImages(const std::string& path,
                                                int64_t* count) {
  ASSIGN_OR_RETURN(std::unique_ptr<ByteFile> file, ByteFile::Open(path));
  ASSIGN_OR_RETURN(const std::vector<uint32_t> sizes,
                   ReadIdxHeader(*file, kIdxImagesMagic, "images", 3));
  *count = sizes[0];
  const uint32_t rows = sizes[1];
  const uint32_t cols = sizes[2];
  if (rows != kFashionMnistRows || cols != kFashionMnistCols) {
    return absl::DataLossError(
        absl::StrCat(path, " holds ", rows, "x", cols, " images, expected ",
                     kFashionMnistRows, "x", kFashionMnistCols));
  }
  if (*count == 0) {
    return absl::DataLossError(absl::StrCat(path, " holds no images"));
  }
  std::vector<uint8_t> pixels;
  RETURN_IF_ERROR(file->ReadExactly(static_cast<size_t>(*count * kPixels),
                                    absl::StrCat(*count, " images"), &pixels));
  return pixels;
}

// Reads the labels file: its header, checked, then all labels.
absl::StatusOr<std::vector<uint8_t>> ReadLabels(const std::string& path,
                                                int64_t* count) {
  ASSIGN_OR_RETURN(std::unique_ptr<ByteFile> file, ByteFile::Open(path));
  ASSIGN_OR_RETURN(const std::vector<uint32_t> sizes,
                   ReadIdxHeader(*file, kIdxLabelsMagic, "labels", 1));
  *count = sizes[0];
  std::vector<uint8_t> labels;
  RETURN_IF_ERROR(file->ReadExactly(static_cast<size_t>(*count),
                                    absl::StrCat(*count, " labels"), &labels));
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= kFashionMnistClasses) {
      return absl::DataLossError(absl::StrCat(
          path, ": label ", static_cast<int>(labels[i]), " of sample ", i,
          " is outside 0..", kFashionMnistClasses - 1));
    }
  }
  return labels;
}

// The path of file `name` in `dir`: the gzip form when present, else the
// plain one; NotFound naming both when neither exists.
absl::StatusOr<std::string> FindIdxFile(const std::string& dir,
                                        const std::string& name) {
  const std::string plain = absl::StrCat(dir, "/", name);
  const std::string gzip = absl::StrCat(plain, ".gz");
  if (PathExists(gzip)) return gzip;
  if (PathExists(plain)) return plain;
  return absl::NotFoundError(absl::StrCat(
      "Fashion-MNIST file not found: ", gzip, " (nor ", plain, ")"));
}

absl::StatusOr<std::unique_ptr<Dataset>> OpenSplit(const std::string& dir,
                                                   const std::string& prefix,
                                                   DataParts parts) {
  std::string images;
  std::string labels;
  if (parts.inputs) {
    ASSIGN_OR_RETURN(images, FindFashionMnistFile(dir, prefix, kImagesFile));
  }
  if (parts.labels) {
    ASSIGN_OR_RETURN(labels, FindFashionMnistFile(dir, prefix, kLabelsFile));
  }
  return LoadFashionMnistSplit(images, labels, parts);
}

}  // namespace

absl::StatusOr<std::string> FindFashionMnistFile(const std::string& dir,
                                                 const std::string& prefix,
                                                 FashionMnistFile file) {
  return FindIdxFile(
      dir, absl::StrCat(prefix, file == kImagesFile ? "-images-idx3-ubyte"
                                                    : "-labels-idx1-ubyte"));
}

absl::StatusOr<std::unique_ptr<Dataset>> LoadFashionMnistSplit(
    const std::string& images_path, const std::string& labels_path,
    DataParts parts) {
  if (!parts.any()) {
    return absl::InvalidArgumentError("data.fashion_mnist: opened for no part");
  }
  int64_t image_count = -1;
  int64_t label_count = -1;
  std::vector<uint8_t> pixels;
  std::vector<uint8_t> labels;
  if (parts.inputs) {
    ASSIGN_OR_RETURN(pixels, ReadImages(images_path, &image_count));
  }
  if (parts.labels) {
    ASSIGN_OR_RETURN(labels, ReadLabels(labels_path, &label_count));
    if (label_count == 0) {
      return absl::DataLossError(absl::StrCat(labels_path, " holds no labels"));
    }
  }
  if (parts.inputs && parts.labels && image_count != label_count) {
    return absl::DataLossError(absl::StrCat(images_path, " holds ", image_count,
                                            " images but ", labels_path,
                                            " holds ", label_count, " labels"));
  }
  return std::unique_ptr<Dataset>(
      new FashionMnistDataset(parts.inputs ? image_count : label_count, parts,
                              std::move(pixels), std::move(labels)));
}

absl::StatusOr<DatasetPair> OpenFashionMnist(
    const v1::FashionMnistSource& source, DataParts parts) {
  const std::string dir = source.dir().empty()
                              ? std::string(kDefaultFashionMnistDir)
                              : source.dir();
  if (!PathExists(dir)) {
    return absl::NotFoundError(absl::StrCat(
        "Fashion-MNIST directory not found: ", dir,
        " (set data.fashion_mnist.dir, or install the Debian package "
        "dataset-fashion-mnist)"));
  }
  DatasetPair pair;
  ASSIGN_OR_RETURN(pair.train, OpenSplit(dir, kFashionMnistTrainPrefix, parts));
  ASSIGN_OR_RETURN(pair.eval, OpenSplit(dir, kFashionMnistEvalPrefix, parts));
  return pair;
}

}  // namespace pipetrain
