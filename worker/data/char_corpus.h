// Byte-level language modelling over text files.
//
// The corpus is the concatenation of the listed files' bytes (gzip files are
// decompressed); the vocabulary is the 256 byte values. Its last
// eval_fraction of bytes is the evaluation split, the rest the train split.
// Sample i of a split is the window starting at the split's byte i: inputs
// are bytes [i, i + T) and labels the next bytes [i + 1, i + T + 1), both as
// exact floats, so a split of n bytes holds n - T samples and no window of
// the train split reads an evaluation byte.
#ifndef PIPETRAIN_WORKER_DATA_CHAR_CORPUS_H_
#define PIPETRAIN_WORKER_DATA_CHAR_CORPUS_H_

#include "absl/status/statusor.h"
#include "pipetrain/v1/job.pb.h"
#include "worker/data/dataset.h"

namespace pipetrain {

inline constexpr int64_t kByteVocabulary = 256;
// Used when CharCorpusSource.eval_fraction is 0.
inline constexpr float kDefaultEvalFraction = 0.1f;

// InvalidArgument naming data.char_corpus.files / .seq_len /
// .eval_fraction when a field is out of range, or naming the files when a
// split is too short for one window; NotFound naming a missing file.
absl::StatusOr<DatasetPair> OpenCharCorpus(const v1::CharCorpusSource& source);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_DATA_CHAR_CORPUS_H_
