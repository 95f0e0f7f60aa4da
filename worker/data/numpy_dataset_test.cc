// The .npy and token-shard readers against NumPy's own writer: the files
// are written by worker/data/testdata/npy_reference.py (numpy.save,
// numpy.lib.format.write_array, ndarray.tofile) from formulas this test
// evaluates too, and must read back exactly. Fails when python3-numpy is
// missing (deploy/setup.sh installs it).
#include "worker/data/numpy_dataset.h"

#include <stdio.h>
#include <sys/wait.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/temp_dir_for_test.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/data_access.h"
#include "worker/data/dataset.h"
#include "worker/data/token_shards.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

class NumpyDatasetTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    const char* source = std::getenv("PIPETRAIN_SOURCE_DIR");
    ASSERT_NE(source, nullptr) << "PIPETRAIN_SOURCE_DIR is set by ctest";
    const std::string command =
        absl::StrCat("/usr/bin/python3 ", source,
                     "/worker/data/testdata/npy_reference.py ", dir_->path());
    const int status = std::system(command.c_str());
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << command << " failed (is python3-numpy installed?)";
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::string File(const std::string& name) {
    return dir_->path() + "/" + name;
  }

  // A source over train files `features` and `labels` (eval the same).
  static v1::NumpySource Source(const std::string& features,
                                const std::string& labels) {
    v1::NumpySource source;
    source.set_train_features(File(features));
    source.set_train_labels(File(labels));
    source.set_eval_features(File(features));
    source.set_eval_labels(File(labels));
    source.set_classes(3);
    return source;
  }

  static absl::Status LoadError(const v1::NumpySource& source) {
    return OpenNumpy(source).status();
  }

  static ScopedTempDir* dir_;
};

ScopedTempDir* NumpyDatasetTest::dir_ = nullptr;

std::vector<float> Sample(const Dataset& data, int64_t i, float* label) {
  std::vector<float> input(NumElements(data.sample_shape()));
  std::vector<float> labels(
      std::max<int64_t>(1, NumElements(data.label_shape())));
  data.Get(i, input.data(), labels.data());
  *label = labels[0];
  return input;
}

TEST_F(NumpyDatasetTest, Float32FeaturesOfEveryVersionReadExactly) {
  for (const char* name : {"f32.npy", "f32_v2.npy", "f32_v3.npy"}) {
    for (const char* labels :
         {"labels_uint8.npy", "labels_int32.npy", "labels_int64.npy"}) {
      absl::StatusOr<DatasetPair> data = OpenNumpy(Source(name, labels));
      ASSERT_TRUE(data.ok()) << name << " " << data.status();
      const Dataset& train = *data->train;
      ASSERT_EQ(train.size(), 5);
      EXPECT_EQ(train.sample_shape(), Shape({2, 3}));
      EXPECT_EQ(train.num_classes(), 3);
      const float expected_labels[] = {0, 2, 1, 2, 0};
      for (int64_t i = 0; i < 5; ++i) {
        float label = -1;
        const std::vector<float> x = Sample(train, i, &label);
        EXPECT_EQ(label, expected_labels[i]) << name << " " << labels;
        for (int64_t k = 0; k < 6; ++k) {
          EXPECT_EQ(x[k], static_cast<float>((i * 6 + k) * 0.37 - 5))
              << name << " sample " << i << " element " << k;
        }
      }
    }
  }
}

TEST_F(NumpyDatasetTest, Uint8FeaturesAreScaledAndNormalized) {
  v1::NumpySource source = Source("u8.npy", "labels_int64.npy");
  source.set_scale(1.0f / 255.0f);
  source.set_mean(0.25f);
  source.set_std(0.5f);
  absl::StatusOr<DatasetPair> data = OpenNumpy(source);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->eval->sample_shape(), Shape({4}));
  for (int64_t i = 0; i < 5; ++i) {
    float label;
    const std::vector<float> x = Sample(*data->eval, i, &label);
    for (int64_t k = 0; k < 4; ++k) {
      const float byte = static_cast<float>(((i * 4 + k) * 37) % 256);
      EXPECT_EQ(x[k], (byte * (1.0f / 255.0f) - 0.25f) / 0.5f);
    }
  }
  source.clear_scale();
  EXPECT_THAT(std::string(LoadError(source).message()),
              HasSubstr("uint8 features need data.numpy.scale"));
}

TEST_F(NumpyDatasetTest, BadFilesAreClearErrorsNamingTheFile) {
  struct Case {
    const char* features;
    const char* labels;
    const char* message;
    bool labels_at_fault;
  };
  const Case cases[] = {
      {"f64.npy", "labels_int64.npy", "unsupported dtype '<f8'", false},
      {"fortran.npy", "labels_int64.npy", "fortran_order is True", false},
      {"big_endian.npy", "labels_int64.npy", "'>f4' is big-endian", false},
      {"truncated.npy", "labels_int64.npy", "(cut short)", false},
      {"f32.npy", "labels_short.npy", "holds 4 labels but", true},
      {"f32.npy", "labels_float.npy", "expected a 1-D integer array", true},
      {"f32.npy", "labels_out_of_range.npy",
       "label 3 of sample 3 is outside 0..2", true},
      {"f32.npy", "labels_negative.npy", "label -1 of sample 2", true},
      {"tokens.bin", "labels_int64.npy", "is not a .npy file", false},
      {"missing.npy", "labels_int64.npy", "missing.npy", false},
  };
  for (const Case& c : cases) {
    const absl::Status status = LoadError(Source(c.features, c.labels));
    EXPECT_FALSE(status.ok()) << c.features << " " << c.labels;
    const std::string message(status.message());
    EXPECT_THAT(message, HasSubstr(c.message));
    // The field and the file the error is about.
    const bool about_labels = c.labels_at_fault;
    EXPECT_THAT(message, HasSubstr(about_labels ? "data.numpy.train_labels"
                                                : "data.numpy.train_features"));
    EXPECT_THAT(message, HasSubstr(about_labels ? c.labels : c.features));
  }
}

// A reader of the inputs maps only the features files, a reader of the
// labels only the labels files; each reads what a reader of both reads.
TEST_F(NumpyDatasetTest, EachPartOpensOnlyItsFiles) {
  absl::StatusOr<DatasetPair> both =
      OpenNumpy(Source("f32.npy", "labels_int32.npy"));
  ASSERT_TRUE(both.ok()) << both.status();
  absl::StatusOr<DatasetPair> inputs =
      OpenNumpy(Source("f32.npy", "missing.npy"), kInputsOnly);
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  absl::StatusOr<DatasetPair> labels =
      OpenNumpy(Source("missing.npy", "labels_int32.npy"), kLabelsOnly);
  ASSERT_TRUE(labels.ok()) << labels.status();
  EXPECT_EQ(inputs->train->size(), 5);
  EXPECT_EQ(labels->train->size(), 5);
  EXPECT_EQ(inputs->train->sample_shape(), Shape({2, 3}));
  EXPECT_FALSE(inputs->train->parts().labels);
  EXPECT_FALSE(labels->train->parts().inputs);
  for (int64_t i = 0; i < 5; ++i) {
    float want_label = -1;
    const std::vector<float> want = Sample(*both->train, i, &want_label);
    std::vector<float> x(6);
    inputs->train->GetInput(i, x.data());
    EXPECT_EQ(x, want) << i;
    float label = -1;
    labels->train->GetLabel(i, &label);
    EXPECT_EQ(label, want_label) << i;
  }
  // Each part's errors still name its field and file.
  const absl::Status bad_labels =
      OpenNumpy(Source("missing.npy", "labels_out_of_range.npy"), kLabelsOnly)
          .status();
  EXPECT_THAT(std::string(bad_labels.message()),
              HasSubstr("data.numpy.train_labels"));
  EXPECT_THAT(std::string(bad_labels.message()),
              HasSubstr("labels_out_of_range.npy"));
  const absl::Status bad_features =
      OpenNumpy(Source("f64.npy", "missing.npy"), kInputsOnly).status();
  EXPECT_THAT(std::string(bad_features.message()),
              HasSubstr("data.numpy.train_features"));
  // The worker's checks too: only the files of the parts it will read.
  v1::DatasetSpec spec;
  *spec.mutable_numpy() = Source("f32.npy", "missing.npy");
  EXPECT_TRUE(CheckDatasetFiles(spec, kInputsOnly).ok());
  EXPECT_THAT(std::string(CheckDatasetFiles(spec, kLabelsOnly).message()),
              HasSubstr("missing.npy"));
  EXPECT_THAT(std::string(CheckDatasetFiles(spec).message()),
              HasSubstr("missing.npy"));
  *spec.mutable_numpy() = Source("missing.npy", "labels_int32.npy");
  EXPECT_TRUE(CheckDatasetFiles(spec, kLabelsOnly).ok());
  EXPECT_THAT(std::string(CheckDatasetFiles(spec, kInputsOnly).message()),
              HasSubstr("missing.npy"));
  EXPECT_TRUE(CheckDatasetFiles(spec, DataParts{false, false}).ok());
}

TEST_F(NumpyDatasetTest, FilesOutsideTheDataRootsAreRefused) {
  ASSERT_TRUE(SetDataAccessPolicy({{"/usr/share/datasets"}, 1 << 20}).ok());
  const absl::Status status = LoadError(Source("f32.npy", "labels_int64.npy"));
  ASSERT_TRUE(SetDataAccessPolicy(DataAccessPolicy()).ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("f32.npy"));
  // The size cap too.
  ASSERT_TRUE(SetDataAccessPolicy({{}, 100}).ok());
  const absl::Status big = LoadError(Source("f32.npy", "labels_int64.npy"));
  ASSERT_TRUE(SetDataAccessPolicy(DataAccessPolicy()).ok());
  EXPECT_THAT(std::string(big.message()), HasSubstr("--max_data_file_bytes"));
}

TEST_F(NumpyDatasetTest, TokenShardsGiveNextTokenWindows) {
  for (const char* name : {"tokens.bin", "tokens_i32.npy"}) {
    absl::StatusOr<std::unique_ptr<Dataset>> data =
        LoadTokenShard(File(name), "data.token_shards.train_file", 6, 11);
    ASSERT_TRUE(data.ok()) << name << " " << data.status();
    ASSERT_EQ((*data)->size(), 40 - 6);
    EXPECT_EQ((*data)->label_shape(), Shape({6}));
    for (int64_t i : {int64_t{0}, int64_t{17}, int64_t{33}}) {
      std::vector<float> x(6), y(6);
      (*data)->Get(i, x.data(), y.data());
      for (int64_t t = 0; t < 6; ++t) {
        EXPECT_EQ(x[t], static_cast<float>(((i + t) * 7) % 11)) << name;
        EXPECT_EQ(y[t], static_cast<float>(((i + t + 1) * 7) % 11)) << name;
      }
    }
  }
}

TEST_F(NumpyDatasetTest, BadTokenShardsAreClearErrors) {
  struct Case {
    const char* file;
    int64_t seq_len;
    const char* message;
  };
  const Case cases[] = {
      {"tokens_bad.bin", 6, "token id 11 at position 17 is outside 0..10"},
      {"odd.bin", 1, "holds 3 bytes, not a whole number of uint16"},
      {"tokens_2d.npy", 6, "expected a 1-D integer array of token ids"},
      {"tokens.bin", 40, "holds 40 tokens, too few for one window"},
      {"truncated.npy", 6, "(cut short)"},
  };
  for (const Case& c : cases) {
    const absl::Status status =
        LoadTokenShard(File(c.file), "data.token_shards.eval_file", c.seq_len,
                       11)
            .status();
    EXPECT_FALSE(status.ok()) << c.file;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.message));
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("data.token_shards.eval_file"));
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.file));
  }
}

TEST_F(NumpyDatasetTest, OpenDatasetDispatchesAndChecksFiles) {
  v1::DatasetSpec spec;
  *spec.mutable_numpy() = Source("f32.npy", "labels_int32.npy");
  EXPECT_TRUE(CheckDatasetFiles(spec).ok());
  absl::StatusOr<DatasetPair> data = OpenDataset(spec, 1);
  ASSERT_TRUE(data.ok()) << data.status();
  absl::StatusOr<Batch> batch = GatherBatch(*data->train, {4, 1});
  ASSERT_TRUE(batch.ok());
  EXPECT_EQ(batch->inputs.shape(), Shape({2, 2, 3}));
  EXPECT_EQ(batch->labels.f32()[1], 2.0f);

  spec.mutable_token_shards()->set_train_file(File("tokens.bin"));
  spec.mutable_token_shards()->set_eval_file(File("nothere.bin"));
  spec.mutable_token_shards()->set_seq_len(6);
  spec.mutable_token_shards()->set_vocab_size(11);
  EXPECT_THAT(std::string(CheckDatasetFiles(spec).message()),
              HasSubstr("nothere.bin"));
  EXPECT_THAT(std::string(OpenDataset(spec, 1).status().message()),
              HasSubstr("data.token_shards.eval_file"));
}

}  // namespace
}  // namespace pipetrain
