#include "worker/data/char_corpus.h"

#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/byte_file.h"

namespace pipetrain {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// 100 printable bytes, ' ' + i % 90, distinct within any 90 in a row.
std::string Corpus100() {
  std::string text;
  for (int i = 0; i < 100; ++i) text.push_back(static_cast<char>(' ' + i % 90));
  return text;
}

std::vector<float> AsFloats(const std::string& text) {
  return std::vector<float>(text.begin(), text.end());
}

struct Sample {
  std::vector<float> input;
  std::vector<float> label;
};

Sample GetSample(const Dataset& dataset, int64_t index) {
  Sample sample{std::vector<float>(NumElements(dataset.sample_shape())),
                std::vector<float>(NumElements(dataset.label_shape()))};
  dataset.Get(index, sample.input.data(), sample.label.data());
  return sample;
}

v1::CharCorpusSource Source(std::vector<std::string> files, int64_t seq_len,
                            float eval_fraction = 0.0f) {
  v1::CharCorpusSource source;
  for (const std::string& f : files) source.add_files(f);
  source.set_seq_len(seq_len);
  source.set_eval_fraction(eval_fraction);
  return source;
}

// Gives each test a fresh temporary directory, unique to this process so
// that runs from several build trees do not collide.
class CharCorpusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(
        ::testing::TempDir(), "/", getpid(), "_CharCorpusTest_",
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::error_code error;
    std::filesystem::remove_all(dir_, error);
    ASSERT_TRUE(std::filesystem::create_directories(dir_, error)) << dir_;
  }

  void TearDown() override {
    std::error_code error;
    std::filesystem::remove_all(dir_, error);
  }

  std::string TempPath(const std::string& name) const {
    return absl::StrCat(dir_, "/", name);
  }

  // A file in the test's directory holding `text`.
  std::string WriteTemp(const std::string& name,
                        const std::string& text) const {
    const std::string path = TempPath(name);
    std::FILE* file = std::fopen(path.c_str(), "wb");
    EXPECT_NE(file, nullptr) << path;
    if (file == nullptr) return path;
    std::fwrite(text.data(), 1, text.size(), file);
    std::fclose(file);
    return path;
  }

  std::string dir_;
};

TEST_F(CharCorpusTest, WindowsAndNextByteLabelsLineUp) {
  const std::string text = Corpus100();
  const std::string path = WriteTemp("corpus100.txt", text);
  absl::StatusOr<DatasetPair> pair = OpenCharCorpus(Source({path}, 4, 0.2f));
  ASSERT_TRUE(pair.ok()) << pair.status();
  const Dataset& train = *pair->train;
  EXPECT_THAT(train.sample_shape(), ElementsAre(4));
  EXPECT_THAT(train.label_shape(), ElementsAre(4));
  EXPECT_EQ(train.num_classes(), 256);
  // 80 train bytes hold 76 windows of 4 inputs and 1 next byte.
  ASSERT_EQ(train.size(), 76);
  for (int64_t i : {0, 37, 75}) {
    const Sample s = GetSample(train, i);
    EXPECT_EQ(s.input, AsFloats(text.substr(i, 4))) << i;
    EXPECT_EQ(s.label, AsFloats(text.substr(i + 1, 4))) << i;
  }
}

TEST_F(CharCorpusTest, EvalSplitIsTheTail) {
  const std::string text = Corpus100();
  const std::string path = WriteTemp("corpus100_eval.txt", text);
  absl::StatusOr<DatasetPair> pair = OpenCharCorpus(Source({path}, 4, 0.2f));
  ASSERT_TRUE(pair.ok()) << pair.status();
  const Dataset& eval = *pair->eval;
  ASSERT_EQ(eval.size(), 16);  // 20 bytes
  const Sample first = GetSample(eval, 0);
  EXPECT_EQ(first.input, AsFloats(text.substr(80, 4)));
  const Sample last = GetSample(eval, 15);
  EXPECT_EQ(last.label, AsFloats(text.substr(96, 4)));
  // The train split's last label is the byte before the eval split.
  const Sample train_last = GetSample(*pair->train, pair->train->size() - 1);
  EXPECT_EQ(train_last.label.back(), static_cast<float>(text[79]));
}

TEST_F(CharCorpusTest, DefaultEvalFractionIsATenth) {
  const std::string path = WriteTemp("corpus100_default.txt", Corpus100());
  absl::StatusOr<DatasetPair> pair = OpenCharCorpus(Source({path}, 4));
  ASSERT_TRUE(pair.ok()) << pair.status();
  EXPECT_EQ(pair->train->size(), 90 - 4);
  EXPECT_EQ(pair->eval->size(), 10 - 4);
}

TEST_F(CharCorpusTest, FilesAreConcatenated) {
  const std::string a = WriteTemp("part_a.txt", "0123456789");
  const std::string b = WriteTemp("part_b.txt", "abcdefghij");
  absl::StatusOr<DatasetPair> pair = OpenCharCorpus(Source({a, b}, 3, 0.3f));
  ASSERT_TRUE(pair.ok()) << pair.status();
  ASSERT_EQ(pair->train->size(), 14 - 3);
  const Sample straddling = GetSample(*pair->train, 8);
  EXPECT_EQ(straddling.input, AsFloats("89a"));
  EXPECT_EQ(straddling.label, AsFloats("9ab"));
}

TEST_F(CharCorpusTest, ReadsGzipFiles) {
  const std::string text = Corpus100();
  const std::string path = TempPath("corpus100.txt.gz");
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr);
  ASSERT_EQ(gzwrite(file, text.data(), text.size()),
            static_cast<int>(text.size()));
  gzclose(file);
  absl::StatusOr<DatasetPair> pair = OpenCharCorpus(Source({path}, 4, 0.2f));
  ASSERT_TRUE(pair.ok()) << pair.status();
  EXPECT_EQ(GetSample(*pair->train, 10).input, AsFloats(text.substr(10, 4)));
}

TEST_F(CharCorpusTest, MissingFileIsNotFoundNamingIt) {
  const std::string missing = TempPath("no-such-corpus.txt");
  absl::StatusOr<DatasetPair> pair = OpenCharCorpus(Source({missing}, 4));
  ASSERT_FALSE(pair.ok());
  EXPECT_EQ(pair.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(pair.status().message(), HasSubstr(missing));
}

TEST_F(CharCorpusTest, BadFieldsAreInvalidArgumentNamingThem) {
  const std::string path = WriteTemp("corpus100_fields.txt", Corpus100());
  struct Case {
    v1::CharCorpusSource source;
    std::string field;
  };
  const std::vector<Case> cases = {
      {Source({}, 4), "char_corpus.files"},
      {Source({path}, 0), "char_corpus.seq_len"},
      {Source({path}, -3), "char_corpus.seq_len"},
      {Source({path}, 4, 1.0f), "char_corpus.eval_fraction"},
      {Source({path}, 4, -0.5f), "char_corpus.eval_fraction"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<DatasetPair> pair = OpenCharCorpus(c.source);
    ASSERT_FALSE(pair.ok()) << c.field;
    EXPECT_EQ(pair.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(pair.status().message(), HasSubstr(c.field));
  }
}

TEST_F(CharCorpusTest, SplitTooShortForAWindowIsInvalidArgumentNamingTheFile) {
  const std::string path = WriteTemp("corpus100_short.txt", Corpus100());
  // The eval split has 10 bytes: too few for 10 inputs plus a next byte.
  absl::StatusOr<DatasetPair> pair = OpenCharCorpus(Source({path}, 10));
  ASSERT_FALSE(pair.ok());
  EXPECT_EQ(pair.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(pair.status().message(), HasSubstr(path));
}

// The text the example jobs train on, from Debian's package fortunes-min.
TEST_F(CharCorpusTest, OpensTheFortunesFile) {
  const std::string path = "/usr/share/games/fortunes/fortunes";
  if (!PathExists(path)) {
    GTEST_SKIP() << path
                 << " does not exist; install the Debian package "
                    "fortunes-min to run this test";
  }
  absl::StatusOr<std::vector<uint8_t>> bytes = ReadWholeFile(path);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  v1::DatasetSpec spec;
  *spec.mutable_char_corpus() = Source({path}, 64);
  absl::StatusOr<DatasetPair> pair = OpenDataset(spec, /*seed=*/0);
  ASSERT_TRUE(pair.ok()) << pair.status();
  const int64_t total = static_cast<int64_t>(bytes->size());
  EXPECT_EQ(pair->train->size() + pair->eval->size(), total - 2 * 64);
  const std::vector<int64_t> indices = {0, 100, pair->train->size() - 1};
  absl::StatusOr<Batch> batch = GatherBatch(*pair->train, indices);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_THAT(batch->inputs.shape(), ElementsAre(3, 64));
  EXPECT_THAT(batch->labels.shape(), ElementsAre(3, 64));
  const std::vector<float> labels = batch->labels.ToVector();
  EXPECT_THAT(std::vector<float>(labels.begin(), labels.begin() + 64),
              ElementsAreArray(
                  std::vector<float>(bytes->begin() + 1, bytes->begin() + 65)));
}

}  // namespace
}  // namespace pipetrain
