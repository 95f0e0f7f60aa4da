#include "worker/data/token_shards.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spec/dataset_spec.h"
#include "worker/data/numpy_dataset.h"

namespace pipetrain {
namespace {

// A shard's tokens: the mapped file, where the ids start, their type.
struct TokenArray {
  std::unique_ptr<MappedFile> file;
  int64_t offset = 0;
  int64_t count = 0;
  NpyDtype dtype = NpyDtype::kUint16;
  int64_t At(int64_t i) const {
    return NpyIntegerAt(file->data() + offset, dtype, i);
  }
};

// Immutable after construction; GetInput and GetLabel are thread-safe.
// Inputs and labels are the same tokens, one apart: either part maps the
// shard.
class TokenShardDataset final : public Dataset {
 public:
  TokenShardDataset(TokenArray tokens, int64_t seq_len, int64_t vocab_size)
      : tokens_(std::move(tokens)), seq_len_(seq_len), vocab_(vocab_size) {}

  int64_t size() const override { return tokens_.count - seq_len_; }
  Shape sample_shape() const override { return {seq_len_}; }
  Shape label_shape() const override { return {seq_len_}; }
  int64_t num_classes() const override { return vocab_; }

  DataParts parts() const override { return kAllDataParts; }

  void GetInput(int64_t index, float* input) const override {
    for (int64_t t = 0; t < seq_len_; ++t) {
      input[t] = static_cast<float>(tokens_.At(index + t));
    }
  }
  void GetLabel(int64_t index, float* label) const override {
    for (int64_t t = 0; t < seq_len_; ++t) {
      label[t] = static_cast<float>(tokens_.At(index + t + 1));
    }
  }

 private:
  // Constant after construction.
  const TokenArray tokens_;
  const int64_t seq_len_;
  const int64_t vocab_;
};

absl::StatusOr<TokenArray> MapTokens(const std::string& path,
                                     const std::string& field) {
  TokenArray tokens;
  if (absl::EndsWith(path, ".npy")) {
    ASSIGN_OR_RETURN(NpyArray array, OpenNpyArray(path, field));
    if (!NpyIsInteger(array.header.dtype) || array.header.shape.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": ", path, " holds ", NpyDtypeName(array.header.dtype),
          " of rank ", array.header.shape.size(),
          "; expected a 1-D integer array of token ids"));
    }
    tokens.offset = array.header.data_offset;
    tokens.count = array.header.elements;
    tokens.dtype = array.header.dtype;
    tokens.file = std::move(array.file);
    return tokens;
  }
  absl::StatusOr<std::unique_ptr<MappedFile>> file = MappedFile::Open(path);
  if (!file.ok()) {
    return absl::Status(file.status().code(),
                        absl::StrCat(field, ": ", file.status().message()));
  }
  tokens.file = *std::move(file);
  if (tokens.file->size() % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", path, " holds ", tokens.file->size(),
                     " bytes, not a whole number of uint16 token ids"));
  }
  tokens.count = tokens.file->size() / 2;
  return tokens;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> LoadTokenShard(
    const std::string& path, const std::string& field, int64_t seq_len,
    int64_t vocab_size) {
  ASSIGN_OR_RETURN(TokenArray tokens, MapTokens(path, field));
  if (tokens.count <= seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", path, " holds ", tokens.count,
        " tokens, too few for one window of seq_len ", seq_len, " + 1"));
  }
  // One pass over the shard: an id the model cannot embed is an error
  // here, with its position, rather than a wrong lookup mid-training.
  for (int64_t i = 0; i < tokens.count; ++i) {
    const int64_t id = tokens.At(i);
    if (id < 0 || id >= vocab_size) {
      return absl::DataLossError(
          absl::StrCat(field, ": ", path, ": token id ", id, " at position ", i,
                       " is outside 0..", vocab_size - 1,
                       " (data.token_shards.vocab_size = ", vocab_size, ")"));
    }
  }
  return std::make_unique<TokenShardDataset>(std::move(tokens), seq_len,
                                             vocab_size);
}

absl::StatusOr<DatasetPair> OpenTokenShards(
    const v1::TokenShardSource& source) {
  RETURN_IF_ERROR(ValidateTokenShardSource(source));
  DatasetPair pair;
  ASSIGN_OR_RETURN(
      pair.train,
      LoadTokenShard(source.train_file(), "data.token_shards.train_file",
                     source.seq_len(), source.vocab_size()));
  ASSIGN_OR_RETURN(
      pair.eval,
      LoadTokenShard(source.eval_file(), "data.token_shards.eval_file",
                     source.seq_len(), source.vocab_size()));
  return pair;
}

}  // namespace pipetrain
