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
// [B, label_shape...] (class ids or next-token ids as exact floats).
struct Batch {
  Tensor inputs;
  Tensor labels;
};

// A random-access collection of samples. Implementations are immutable after
// construction and thread-safe.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Shape of one input sample, e.g. [784] or [T].
  virtual Shape sample_shape() const = 0;
  // Shape of one sample's label: [] for a class id, [T] for next tokens.
  virtual Shape label_shape() const = 0;
  // Number of classes (vocabulary size for language models).
  virtual int64_t num_classes() const = 0;
  // Writes sample `index` (0 <= index < size()) into `input`
  // (numel(sample_shape) floats) and `label` (numel(label_shape) floats).
  virtual void Get(int64_t index, float* input, float* label) const = 0;
};

// Copies the samples at `indices` into one host Batch. OutOfRange when an
// index is outside the dataset.
absl::StatusOr<Batch> GatherBatch(const Dataset& dataset,
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

// Opens the dataset a spec names. NotFound / DataLoss / InvalidArgument
// errors name the offending file or field.
absl::StatusOr<DatasetPair> OpenDataset(const v1::DatasetSpec& spec,
                                        uint64_t seed);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_DATA_DATASET_H_
