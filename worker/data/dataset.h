// Datasets: where a job's samples come from, and in which order.
//
// The order of samples is a pure function of (seed, step), so a job resumed
// at step s reads exactly the samples it would have read, skipping and
// repeating nothing.
#ifndef PIPETRAIN_WORKER_DATA_DATASET_H_
#define PIPETRAIN_WORKER_DATA_DATASET_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "pipetrain/v1/job.pb.h"
#include "worker/compute/tensor.h"

namespace pipetrain {

// One mini-batch on the host: inputs [B, sample_shape...] and labels
// [B, label_shape...] (class ids or next-token ids as exact floats). A
// reader of one part leaves the other empty.
struct Batch {
  Tensor inputs;
  Tensor labels;
};

// Which parts of the samples a reader needs. A pipeline's stage 0 reads
// only the inputs and its last stage only the labels (a one-stage pipeline
// and the in-process trainer both; middle stages nothing). A dataset opened
// for one part opens only the files that part lies in where the format
// keeps them apart (.npy features and labels, Fashion-MNIST's images and
// labels files); a character corpus or a token shard holds both in the
// same bytes, and synthetic labels are computed from the inputs.
struct DataParts {
  bool inputs = true;
  bool labels = true;
  bool any() const { return inputs || labels; }
};
inline constexpr DataParts kAllDataParts = {true, true};
inline constexpr DataParts kInputsOnly = {true, false};
inline constexpr DataParts kLabelsOnly = {false, true};

// A random-access collection of samples. Implementations are immutable after
// construction and thread-safe.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Shape of one input sample, e.g. [784] or [T]; [] for a .npy dataset
  // opened without its inputs (only the features file says).
  virtual Shape sample_shape() const = 0;
  // Shape of one sample's label: [] for a class id, [T] for next tokens.
  virtual Shape label_shape() const = 0;
  // Number of classes (vocabulary size for language models).
  virtual int64_t num_classes() const = 0;
  // The parts this dataset can produce: those it was opened for, or both
  // when its files hold them together.
  virtual DataParts parts() const = 0;
  // Writes sample `index`'s (0 <= index < size()) input into `input`
  // (numel(sample_shape) floats). Requires parts().inputs.
  virtual void GetInput(int64_t index, float* input) const = 0;
  // Writes sample `index`'s label into `label` (numel(label_shape)
  // floats). Requires parts().labels.
  virtual void GetLabel(int64_t index, float* label) const = 0;
  // Both at once (what GetInput and GetLabel write). Requires both parts.
  virtual void Get(int64_t index, float* input, float* label) const {
    GetInput(index, input);
    GetLabel(index, label);
  }
};

// Copies the samples at `indices` into one host Batch, inputs and labels.
// OutOfRange when an index is outside the dataset; FailedPrecondition when
// the dataset was opened without a part.
absl::StatusOr<Batch> GatherBatch(const Dataset& dataset,
                                  absl::Span<const int64_t> indices);
// Only the inputs [B, sample_shape...] or only the labels [B,
// label_shape...] of the samples at `indices`; errors as GatherBatch's
// for the one part.
absl::StatusOr<Tensor> GatherInputs(const Dataset& dataset,
                                    absl::Span<const int64_t> indices);
absl::StatusOr<Tensor> GatherLabels(const Dataset& dataset,
                                    absl::Span<const int64_t> indices);

// Which samples make up each step's mini-batch: every epoch is a seeded
// permutation of the dataset, cut into size / batch_size batches (the tail
// that does not fill a batch is left out of that epoch). Immutable and
// thread-safe.
//
// The permutation is a swap-or-not shuffle keyed by (seed, epoch), evaluated
// per position, so IndicesForStep costs O(batch_size * log(dataset_size))
// whatever the dataset's size and keeps no state between calls.
//
// Requires dataset_size >= 1 and batch_size >= 1 (otherwise every step is
// empty). When batch_size > dataset_size an epoch is one step whose batch
// walks the permutation cyclically, repeating samples.
class SampleOrder {
 public:
  SampleOrder(int64_t dataset_size, int64_t batch_size, uint64_t seed);
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t EpochOfStep(int64_t step) const { return step / steps_per_epoch_; }
  // The dataset indices of step `step`'s mini-batch (batch_size of them);
  // empty for a negative step.
  std::vector<int64_t> IndicesForStep(int64_t step) const;

 private:
  const int64_t dataset_size_;
  const int64_t batch_size_;
  const uint64_t seed_;
  const int64_t steps_per_epoch_;
};

// The train and evaluation splits of a job's dataset.
struct DatasetPair {
  std::unique_ptr<Dataset> train;
  std::unique_ptr<Dataset> eval;
};

// Opens the dataset a spec names, for the parts `parts` names (at least
// one): only the files those parts lie in are opened and checked. NotFound
// / DataLoss / InvalidArgument errors name the offending file or field.
absl::StatusOr<DatasetPair> OpenDataset(const v1::DatasetSpec& spec,
                                        uint64_t seed,
                                        DataParts parts = kAllDataParts);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_DATA_DATASET_H_
