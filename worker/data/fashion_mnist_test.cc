#include "worker/data/fashion_mnist.h"

#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/byte_file.h"
#include "worker/data/data_access.h"

namespace pipetrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

void AppendBigEndian(uint32_t value, std::vector<uint8_t>* out) {
  for (int shift = 24; shift >= 0; shift -= 8) {
    out->push_back(static_cast<uint8_t>(value >> shift));
  }
}

// An IDX images file of `count` images whose pixels are (image + p) % 256.
std::vector<uint8_t> ImagesFile(uint32_t count, uint32_t rows = 28,
                                uint32_t cols = 28,
                                uint32_t magic = kIdxImagesMagic) {
  std::vector<uint8_t> bytes;
  AppendBigEndian(magic, &bytes);
  AppendBigEndian(count, &bytes);
  AppendBigEndian(rows, &bytes);
  AppendBigEndian(cols, &bytes);
  for (uint32_t i = 0; i < count; ++i) {
    for (uint32_t p = 0; p < rows * cols; ++p) {
      bytes.push_back(static_cast<uint8_t>((i + p) % 256));
    }
  }
  return bytes;
}

// An IDX labels file whose label i is labels[i].
std::vector<uint8_t> LabelsFile(const std::vector<uint8_t>& labels,
                                uint32_t magic = kIdxLabelsMagic) {
  std::vector<uint8_t> bytes;
  AppendBigEndian(magic, &bytes);
  AppendBigEndian(static_cast<uint32_t>(labels.size()), &bytes);
  bytes.insert(bytes.end(), labels.begin(), labels.end());
  return bytes;
}

float Normalized(int pixel) {
  return (pixel / 255.0f - kFashionMnistMean) / kFashionMnistStd;
}

// Runs every file test twice: with plain and with gzip-compressed files.
class FashionMnistFilesTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = absl::StrCat(info->test_suite_name(), "_", info->name());
    for (char& c : name) {
      if (c == '/') c = '_';
    }
    dir_ = absl::StrCat(::testing::TempDir(), "/", getpid(), "_", name);
    std::error_code error;
    std::filesystem::remove_all(dir_, error);
    ASSERT_TRUE(std::filesystem::create_directories(dir_, error)) << dir_;
  }

  void TearDown() override {
    std::error_code error;
    std::filesystem::remove_all(dir_, error);
  }

  bool gzip() const { return GetParam(); }

  // Writes `bytes` as dir_/name (plus ".gz" when compressing); returns the
  // path written.
  std::string Write(const std::string& name,
                    const std::vector<uint8_t>& bytes) {
    const std::string path = absl::StrCat(dir_, "/", name, gzip() ? ".gz" : "");
    if (gzip()) {
      gzFile file = gzopen(path.c_str(), "wb");
      EXPECT_NE(file, nullptr) << path;
      if (file == nullptr) return path;
      EXPECT_EQ(gzwrite(file, bytes.data(), bytes.size()),
                static_cast<int>(bytes.size()));
      gzclose(file);
    } else {
      std::FILE* file = std::fopen(path.c_str(), "wb");
      EXPECT_NE(file, nullptr) << path;
      if (file == nullptr) return path;
      std::fwrite(bytes.data(), 1, bytes.size(), file);
      std::fclose(file);
    }
    return path;
  }

  // Writes a valid split "prefix" of three images with labels 0, 9, 4.
  void WriteSplit(const std::string& prefix) {
    Write(prefix + "-images-idx3-ubyte", ImagesFile(3));
    Write(prefix + "-labels-idx1-ubyte", LabelsFile({0, 9, 4}));
  }

  v1::FashionMnistSource Source() const {
    v1::FashionMnistSource source;
    source.set_dir(dir_);
    return source;
  }

  std::string dir_;
};

TEST_P(FashionMnistFilesTest, ReadsWrittenFiles) {
  WriteSplit("train");
  WriteSplit("t10k");
  absl::StatusOr<DatasetPair> pair = OpenFashionMnist(Source());
  ASSERT_TRUE(pair.ok()) << pair.status();
  EXPECT_EQ(pair->train->size(), 3);
  EXPECT_EQ(pair->eval->size(), 3);
  std::vector<float> input(784);
  float label = -1.0f;
  pair->train->Get(1, input.data(), &label);
  EXPECT_EQ(label, 9.0f);
  EXPECT_FLOAT_EQ(input[0], Normalized(1));
  EXPECT_FLOAT_EQ(input[254], Normalized(255));
  EXPECT_FLOAT_EQ(input[255], Normalized(0));
  EXPECT_FLOAT_EQ(input[783], Normalized((1 + 783) % 256));
}

// A reader of one part opens only that part's files: the images without
// the labels files, the labels without the images files.
TEST_P(FashionMnistFilesTest, EachPartReadsOnlyItsFiles) {
  Write("train-images-idx3-ubyte", ImagesFile(3));
  Write("t10k-images-idx3-ubyte", ImagesFile(2));
  absl::StatusOr<DatasetPair> inputs = OpenFashionMnist(Source(), kInputsOnly);
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  EXPECT_EQ(inputs->train->size(), 3);
  EXPECT_EQ(inputs->eval->size(), 2);
  EXPECT_FALSE(inputs->train->parts().labels);
  std::vector<float> input(784);
  inputs->train->GetInput(1, input.data());
  EXPECT_FLOAT_EQ(input[0], Normalized(1));
  EXPECT_THAT(OpenFashionMnist(Source()).status().message(),
              HasSubstr("train-labels-idx1-ubyte"));
  v1::DatasetSpec spec;
  *spec.mutable_fashion_mnist() = Source();
  EXPECT_TRUE(CheckDatasetFiles(spec, kInputsOnly).ok());
  EXPECT_THAT(CheckDatasetFiles(spec, kLabelsOnly).message(),
              HasSubstr("train-labels-idx1-ubyte"));

  std::error_code error;
  std::filesystem::remove_all(dir_, error);
  ASSERT_TRUE(std::filesystem::create_directories(dir_, error)) << dir_;
  Write("train-labels-idx1-ubyte", LabelsFile({0, 9, 4, 7}));
  Write("t10k-labels-idx1-ubyte", LabelsFile({3}));
  absl::StatusOr<DatasetPair> labels = OpenFashionMnist(Source(), kLabelsOnly);
  ASSERT_TRUE(labels.ok()) << labels.status();
  EXPECT_EQ(labels->train->size(), 4);
  EXPECT_EQ(labels->eval->size(), 1);
  EXPECT_FALSE(labels->train->parts().inputs);
  float label = -1.0f;
  labels->train->GetLabel(3, &label);
  EXPECT_EQ(label, 7.0f);
  EXPECT_THAT(OpenFashionMnist(Source(), kInputsOnly).status().message(),
              HasSubstr("train-images-idx3-ubyte"));
  EXPECT_TRUE(CheckDatasetFiles(spec, kLabelsOnly).ok());
  EXPECT_THAT(CheckDatasetFiles(spec, kInputsOnly).message(),
              HasSubstr("train-images-idx3-ubyte"));
  // Nothing for a stage that reads no part.
  EXPECT_TRUE(CheckDatasetFiles(spec, DataParts{false, false}).ok());
}

TEST_P(FashionMnistFilesTest, MissingDirectoryIsNotFoundNamingIt) {
  v1::FashionMnistSource source;
  source.set_dir(dir_ + "/no-such-dir");
  absl::StatusOr<DatasetPair> pair = OpenFashionMnist(source);
  ASSERT_FALSE(pair.ok());
  EXPECT_EQ(pair.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(pair.status().message(), HasSubstr(dir_ + "/no-such-dir"));
}

TEST_P(FashionMnistFilesTest, MissingFileIsNotFoundNamingIt) {
  WriteSplit("train");
  Write("t10k-images-idx3-ubyte", ImagesFile(3));
  absl::StatusOr<DatasetPair> pair = OpenFashionMnist(Source());
  ASSERT_FALSE(pair.ok());
  EXPECT_EQ(pair.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(pair.status().message(),
              HasSubstr(dir_ + "/t10k-labels-idx1-ubyte"));
}

TEST_P(FashionMnistFilesTest, TruncatedImagesAreDataLossNamingTheFile) {
  std::vector<uint8_t> images = ImagesFile(3);
  images.resize(images.size() - 100);
  const std::string images_path = Write("train-images-idx3-ubyte", images);
  const std::string labels_path =
      Write("train-labels-idx1-ubyte", LabelsFile({0, 9, 4}));
  absl::StatusOr<std::unique_ptr<Dataset>> split =
      LoadFashionMnistSplit(images_path, labels_path);
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(split.status().message(), HasSubstr(images_path));
}

TEST_P(FashionMnistFilesTest, TruncatedHeaderIsDataLossNamingTheFile) {
  const std::string labels_path =
      Write("train-labels-idx1-ubyte", {0x00, 0x00, 0x08});
  const std::string images_path =
      Write("train-images-idx3-ubyte", ImagesFile(3));
  absl::StatusOr<std::unique_ptr<Dataset>> split =
      LoadFashionMnistSplit(images_path, labels_path);
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(split.status().message(), HasSubstr(labels_path));
}

TEST_P(FashionMnistFilesTest, BadMagicIsAnErrorNamingTheFile) {
  const std::string images_path = Write(
      "train-images-idx3-ubyte", ImagesFile(3, 28, 28, /*magic=*/0x03080000));
  const std::string labels_path =
      Write("train-labels-idx1-ubyte", LabelsFile({0, 9, 4}));
  absl::StatusOr<std::unique_ptr<Dataset>> split =
      LoadFashionMnistSplit(images_path, labels_path);
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(split.status().message(), HasSubstr(images_path));

  // A labels file given where images belong is caught by its magic too.
  split = LoadFashionMnistSplit(labels_path, labels_path);
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(split.status().message(), HasSubstr(labels_path));
}

TEST_P(FashionMnistFilesTest, WrongDimensionsAreDataLoss) {
  const std::string images_path =
      Write("train-images-idx3-ubyte", ImagesFile(3, 32, 32));
  const std::string labels_path =
      Write("train-labels-idx1-ubyte", LabelsFile({0, 9, 4}));
  absl::StatusOr<std::unique_ptr<Dataset>> split =
      LoadFashionMnistSplit(images_path, labels_path);
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(split.status().message(), HasSubstr(images_path));
  EXPECT_THAT(split.status().message(), HasSubstr("32x32"));
}

TEST_P(FashionMnistFilesTest, CountMismatchIsDataLossNamingBothFiles) {
  const std::string images_path =
      Write("train-images-idx3-ubyte", ImagesFile(3));
  const std::string labels_path =
      Write("train-labels-idx1-ubyte", LabelsFile({0, 9}));
  absl::StatusOr<std::unique_ptr<Dataset>> split =
      LoadFashionMnistSplit(images_path, labels_path);
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(split.status().message(), HasSubstr(images_path));
  EXPECT_THAT(split.status().message(), HasSubstr(labels_path));
}

TEST_P(FashionMnistFilesTest, LabelOutsideTheClassesIsDataLoss) {
  const std::string images_path =
      Write("train-images-idx3-ubyte", ImagesFile(3));
  const std::string labels_path =
      Write("train-labels-idx1-ubyte", LabelsFile({0, 10, 4}));
  absl::StatusOr<std::unique_ptr<Dataset>> split =
      LoadFashionMnistSplit(images_path, labels_path);
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(split.status().message(), HasSubstr(labels_path));
}

INSTANTIATE_TEST_SUITE_P(PlainAndGzip, FashionMnistFilesTest,
                         ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Gzip" : "Plain";
                         });

// A gzip stream cut short (a partial download) is caught as such.
TEST(FashionMnistCorruptGzipTest, CutGzipStreamIsDataLossNamingTheFile) {
  const std::string dir = ::testing::TempDir();
  const std::string gz_path =
      absl::StrCat(dir, "/", getpid(), "_cut-images-idx3-ubyte.gz");
  gzFile out = gzopen(gz_path.c_str(), "wb");
  ASSERT_NE(out, nullptr);
  const std::vector<uint8_t> images = ImagesFile(50);
  ASSERT_EQ(gzwrite(out, images.data(), images.size()),
            static_cast<int>(images.size()));
  gzclose(out);
  std::FILE* raw = std::fopen(gz_path.c_str(), "rb");
  ASSERT_NE(raw, nullptr);
  std::vector<uint8_t> gz_bytes(1 << 16);
  gz_bytes.resize(std::fread(gz_bytes.data(), 1, gz_bytes.size(), raw));
  std::fclose(raw);
  ASSERT_GT(gz_bytes.size(), 200u);
  raw = std::fopen(gz_path.c_str(), "wb");
  ASSERT_NE(raw, nullptr);
  std::fwrite(gz_bytes.data(), 1, gz_bytes.size() / 2, raw);
  std::fclose(raw);

  const std::string labels_path = dir + "/no-such-labels-idx1-ubyte";
  absl::StatusOr<std::unique_ptr<Dataset>> split =
      LoadFashionMnistSplit(gz_path, labels_path);
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(split.status().message(), HasSubstr(gz_path));
  std::remove(gz_path.c_str());
}

// The real data set, from Debian's package dataset-fashion-mnist.
TEST(FashionMnistPackageTest, OpensTheInstalledDataSet) {
  if (!PathExists(kDefaultFashionMnistDir)) {
    GTEST_SKIP() << kDefaultFashionMnistDir
                 << " does not exist; install the Debian package "
                    "dataset-fashion-mnist to run this test";
  }
  v1::DatasetSpec spec;
  spec.mutable_fashion_mnist();  // empty dir: the package's location
  absl::StatusOr<DatasetPair> pair = OpenDataset(spec, /*seed=*/0);
  ASSERT_TRUE(pair.ok()) << pair.status();
  EXPECT_EQ(pair->train->size(), 60000);
  EXPECT_EQ(pair->eval->size(), 10000);
  EXPECT_THAT(pair->train->sample_shape(), ElementsAre(784));
  EXPECT_TRUE(pair->train->label_shape().empty());
  EXPECT_EQ(pair->train->num_classes(), 10);

  // Every class holds a tenth of the train split, and the normalization
  // gives the train pixels zero mean and unit variance.
  std::vector<int64_t> class_counts(10, 0);
  std::vector<float> input(784);
  double sum = 0.0;
  double sum_squares = 0.0;
  for (int64_t i = 0; i < pair->train->size(); ++i) {
    float label = -1.0f;
    pair->train->Get(i, input.data(), &label);
    ASSERT_GE(label, 0.0f);
    ASSERT_LE(label, 9.0f);
    ASSERT_EQ(label, std::floor(label));
    ++class_counts[static_cast<int>(label)];
    for (float x : input) {
      sum += x;
      sum_squares += static_cast<double>(x) * x;
    }
  }
  for (int c = 0; c < 10; ++c) EXPECT_EQ(class_counts[c], 6000) << c;
  const double n = 60000.0 * 784.0;
  const double mean = sum / n;
  EXPECT_NEAR(mean, 0.0, 0.005);
  EXPECT_NEAR(std::sqrt(sum_squares / n - mean * mean), 1.0, 0.005);
}

}  // namespace
}  // namespace pipetrain
