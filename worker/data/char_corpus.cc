#include "worker/data/char_corpus.h"

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/data/byte_file.h"
#include "worker/data/data_access.h"

namespace pipetrain {
namespace {

// One split: a byte range of the shared corpus. Immutable after
// construction; GetInput and GetLabel are thread-safe. Inputs and labels
// are the same bytes, one apart, so either part needs the whole corpus.
class CharWindowDataset final : public Dataset {
 public:
  CharWindowDataset(std::shared_ptr<const std::vector<uint8_t>> corpus,
                    int64_t begin, int64_t length, int64_t seq_len)
      : corpus_(std::move(corpus)),
        begin_(begin),
        length_(length),
        seq_len_(seq_len) {}

  int64_t size() const override { return length_ - seq_len_; }
  Shape sample_shape() const override { return {seq_len_}; }
  Shape label_shape() const override { return {seq_len_}; }
  int64_t num_classes() const override { return kByteVocabulary; }

  DataParts parts() const override { return kAllDataParts; }

  void GetInput(int64_t index, float* input) const override {
    const uint8_t* window = corpus_->data() + begin_ + index;
    for (int64_t t = 0; t < seq_len_; ++t) {
      input[t] = static_cast<float>(window[t]);
    }
  }
  void GetLabel(int64_t index, float* label) const override {
    const uint8_t* window = corpus_->data() + begin_ + index;
    for (int64_t t = 0; t < seq_len_; ++t) {
      label[t] = static_cast<float>(window[t + 1]);
    }
  }

 private:
  // Constant after construction.
  const std::shared_ptr<const std::vector<uint8_t>> corpus_;
  const int64_t begin_;   // first byte of the split in *corpus_
  const int64_t length_;  // bytes in the split
  const int64_t seq_len_;
};

absl::Status ValidateSource(const v1::CharCorpusSource& source) {
  if (source.files().empty()) {
    return absl::InvalidArgumentError(
        "data.char_corpus.files is empty: list at least one text file");
  }
  if (source.seq_len() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.char_corpus.seq_len must be positive, got ", source.seq_len()));
  }
  const float fraction = source.eval_fraction();
  if (!(fraction >= 0.0f && fraction < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.char_corpus.eval_fraction must be in [0, 1), got ", fraction));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint8_t>> ReadCorpus(
    const v1::CharCorpusSource& source) {
  std::vector<uint8_t> corpus;
  for (const std::string& path : source.files()) {
    ASSIGN_OR_RETURN(std::unique_ptr<ByteFile> file, ByteFile::Open(path));
    RETURN_IF_ERROR(file->ReadToEnd(&corpus));
    // Each file is capped; so is the whole (one file listed many times).
    const int64_t cap = GetDataAccessPolicy().max_file_bytes;
    if (static_cast<int64_t>(corpus.size()) > cap) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.char_corpus: the files hold more than ", cap,
                       " bytes together, the limit (--max_data_file_bytes)"));
    }
  }
  return corpus;
}

}  // namespace

absl::StatusOr<DatasetPair> OpenCharCorpus(const v1::CharCorpusSource& source) {
  RETURN_IF_ERROR(ValidateSource(source));
  ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadCorpus(source));
  const int64_t total = static_cast<int64_t>(bytes.size());
  const double fraction = source.eval_fraction() == 0.0f
                              ? kDefaultEvalFraction
                              : source.eval_fraction();
  const int64_t eval_len = std::llround(static_cast<double>(total) * fraction);
  const int64_t train_len = total - eval_len;
  const int64_t seq_len = source.seq_len();
  // A window needs seq_len + 1 bytes: inputs plus the one next byte.
  if (train_len <= seq_len || eval_len <= seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.char_corpus: the corpus (", absl::StrJoin(source.files(), ", "),
        ") is too short: ", total, " bytes give a train split of ", train_len,
        " and an evaluation split of ", eval_len,
        " bytes, and each needs more than seq_len = ", seq_len));
  }
  auto corpus = std::make_shared<const std::vector<uint8_t>>(std::move(bytes));
  DatasetPair pair;
  pair.train =
      std::make_unique<CharWindowDataset>(corpus, 0, train_len, seq_len);
  pair.eval = std::make_unique<CharWindowDataset>(std::move(corpus), train_len,
                                                  eval_len, seq_len);
  return pair;
}

}  // namespace pipetrain
