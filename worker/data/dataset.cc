#include "worker/data/dataset.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/compute/elementwise_math.h"
#include "worker/data/char_corpus.h"
#include "worker/data/fashion_mnist.h"
#include "worker/data/numpy_dataset.h"
#include "worker/data/synthetic.h"
#include "worker/data/token_shards.h"

namespace pipetrain {
namespace {

// Salt that keeps the data order's random stream apart from other users of
// the job seed (initialization, dropout, synthetic data).
constexpr uint64_t kOrderSalt = 0x6f72646572736565ull;  // "orderseE"

// Rounds of the swap-or-not shuffle for a domain of n elements. About
// 6 * log2(n) rounds make it indistinguishable from a uniform permutation
// (Hoang, Morris and Rogaway, CRYPTO 2012); the floor helps tiny domains.
int SwapOrNotRounds(int64_t n) {
  int bits = 0;
  while (bits < 63 && (int64_t{1} << bits) < n) ++bits;
  return std::max(6 * bits, 24);
}

// One epoch's permutation of [0, n), evaluated one position at a time.
//
// Swap-or-not: each round pairs x with (key - x) mod n and swaps the pair
// when a hash of the larger member says so. Every round is an involution,
// so the composition is a bijection; each position costs O(rounds) hashes
// and no O(n) table is built, which keeps IndicesForStep proportional to the
// batch even on large corpora.
class EpochPermutation {
 public:
  EpochPermutation(int64_t n, uint64_t seed, int64_t epoch) : n_(n) {
    const uint64_t epoch_seed = math::SplitMix64(
        seed ^ kOrderSalt ^ math::SplitMix64(static_cast<uint64_t>(epoch)));
    const int rounds = SwapOrNotRounds(n);
    keys_.reserve(rounds);
    round_seeds_.reserve(rounds);
    for (int r = 0; r < rounds; ++r) {
      const uint64_t base = epoch_seed + 2 * static_cast<uint64_t>(r);
      keys_.push_back(static_cast<int64_t>(math::SplitMix64(base) %
                                           static_cast<uint64_t>(n)));
      round_seeds_.push_back(math::SplitMix64(base + 1));
    }
  }

  // The element at `position` (0 <= position < n).
  int64_t At(int64_t position) const {
    int64_t x = position;
    for (size_t r = 0; r < keys_.size(); ++r) {
      int64_t partner = keys_[r] - x;
      if (partner < 0) partner += n_;
      const uint64_t larger = static_cast<uint64_t>(std::max(x, partner));
      if (math::SplitMix64(round_seeds_[r] + larger) >> 63) x = partner;
    }
    return x;
  }

 private:
  const int64_t n_;
  std::vector<int64_t> keys_;
  std::vector<uint64_t> round_seeds_;
};

absl::Status CheckIndices(const Dataset& dataset,
                          absl::Span<const int64_t> indices) {
  const int64_t size = dataset.size();
  for (int64_t index : indices) {
    if (index < 0 || index >= size) {
      return absl::OutOfRangeError(absl::StrCat("sample index ", index,
                                                " is outside the dataset of ",
                                                size, " samples"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckParts(const Dataset& dataset, DataParts wanted) {
  const DataParts has = dataset.parts();
  if ((wanted.inputs && !has.inputs) || (wanted.labels && !has.labels)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the dataset was opened without its ",
                     wanted.inputs && !has.inputs ? "inputs" : "labels"));
  }
  return absl::OkStatus();
}

// A host tensor [batch, sample...].
absl::StatusOr<Tensor> BatchTensor(int64_t batch, const Shape& sample) {
  Shape shape = {batch};
  shape.insert(shape.end(), sample.begin(), sample.end());
  return Tensor::TryHost(std::move(shape));
}

}  // namespace

absl::StatusOr<Batch> GatherBatch(const Dataset& dataset,
                                  absl::Span<const int64_t> indices) {
  RETURN_IF_ERROR(CheckParts(dataset, kAllDataParts));
  RETURN_IF_ERROR(CheckIndices(dataset, indices));
  const int64_t batch = static_cast<int64_t>(indices.size());
  const Shape sample_shape = dataset.sample_shape();
  const Shape label_shape = dataset.label_shape();
  Batch out;
  ASSIGN_OR_RETURN(out.inputs, BatchTensor(batch, sample_shape));
  ASSIGN_OR_RETURN(out.labels, BatchTensor(batch, label_shape));
  const int64_t input_numel = NumElements(sample_shape);
  const int64_t label_numel = NumElements(label_shape);
  float* inputs = out.inputs.f32();
  float* labels = out.labels.f32();
  for (int64_t b = 0; b < batch; ++b) {
    dataset.Get(indices[b], inputs + b * input_numel, labels + b * label_numel);
  }
  return out;
}

absl::StatusOr<Tensor> GatherInputs(const Dataset& dataset,
                                    absl::Span<const int64_t> indices) {
  RETURN_IF_ERROR(CheckParts(dataset, kInputsOnly));
  RETURN_IF_ERROR(CheckIndices(dataset, indices));
  const Shape sample_shape = dataset.sample_shape();
  ASSIGN_OR_RETURN(Tensor out, BatchTensor(static_cast<int64_t>(indices.size()),
                                           sample_shape));
  const int64_t numel = NumElements(sample_shape);
  float* inputs = out.f32();
  for (size_t b = 0; b < indices.size(); ++b) {
    dataset.GetInput(indices[b], inputs + static_cast<int64_t>(b) * numel);
  }
  return out;
}

absl::StatusOr<Tensor> GatherLabels(const Dataset& dataset,
                                    absl::Span<const int64_t> indices) {
  RETURN_IF_ERROR(CheckParts(dataset, kLabelsOnly));
  RETURN_IF_ERROR(CheckIndices(dataset, indices));
  const Shape label_shape = dataset.label_shape();
  ASSIGN_OR_RETURN(Tensor out, BatchTensor(static_cast<int64_t>(indices.size()),
                                           label_shape));
  const int64_t numel = NumElements(label_shape);
  float* labels = out.f32();
  for (size_t b = 0; b < indices.size(); ++b) {
    dataset.GetLabel(indices[b], labels + static_cast<int64_t>(b) * numel);
  }
  return out;
}

SampleOrder::SampleOrder(int64_t dataset_size, int64_t batch_size,
                         uint64_t seed)
    : dataset_size_(dataset_size),
      batch_size_(batch_size),
      seed_(seed),
      steps_per_epoch_(batch_size > 0
                           ? std::max<int64_t>(dataset_size / batch_size, 1)
                           : 1) {}

std::vector<int64_t> SampleOrder::IndicesForStep(int64_t step) const {
  std::vector<int64_t> indices;
  if (dataset_size_ <= 0 || batch_size_ <= 0 || step < 0) return indices;
  const EpochPermutation permutation(dataset_size_, seed_, EpochOfStep(step));
  const int64_t first = (step % steps_per_epoch_) * batch_size_;
  indices.reserve(batch_size_);
  for (int64_t k = 0; k < batch_size_; ++k) {
    // Wraps only when batch_size > dataset_size (one step per epoch).
    indices.push_back(permutation.At((first + k) % dataset_size_));
  }
  return indices;
}

absl::StatusOr<DatasetPair> OpenDataset(const v1::DatasetSpec& spec,
                                        uint64_t seed, DataParts parts) {
  if (!parts.any()) {
    return absl::InvalidArgumentError(
        "data: opened for neither inputs nor labels");
  }
  switch (spec.source_case()) {
    case v1::DatasetSpec::kFashionMnist:
      return OpenFashionMnist(spec.fashion_mnist(), parts);
    case v1::DatasetSpec::kCharCorpus:
      return OpenCharCorpus(spec.char_corpus());
    case v1::DatasetSpec::kSynthetic:
      return OpenSynthetic(spec.synthetic(), seed);
    case v1::DatasetSpec::kNumpy:
      return OpenNumpy(spec.numpy(), parts);
    case v1::DatasetSpec::kTokenShards:
      return OpenTokenShards(spec.token_shards());
    case v1::DatasetSpec::SOURCE_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "data: no dataset source is set (expected one of fashion_mnist, "
      "char_corpus, synthetic, numpy or token_shards)");
}

}  // namespace pipetrain
