// Language-model datasets over token-id shards (data.token_shards): a raw
// little-endian uint16 ".bin" as nanoGPT's prepare.py writes train.bin and
// val.bin, or a 1-D integer ".npy". The shard is memory-mapped
// (mapped_file.h). Sample i of a shard of n tokens is the window of tokens
// [i, i + T) with the next tokens [i + 1, i + T + 1) as targets, both as
// exact floats, so a shard holds n - T samples. Every token id is checked
// once at open to lie in 0..vocab_size-1.
#ifndef PIPETRAIN_WORKER_DATA_TOKEN_SHARDS_H_
#define PIPETRAIN_WORKER_DATA_TOKEN_SHARDS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "pipetrain/v1/job.pb.h"
#include "worker/data/dataset.h"

namespace pipetrain {

// Loads one shard. Errors name `field` and the file: InvalidArgument for a
// .bin of odd length, a .npy that is not a 1-D integer array, or a shard
// too short for one window; DataLoss for a token id out of range (with its
// position) or a malformed .npy.
absl::StatusOr<std::unique_ptr<Dataset>> LoadTokenShard(
    const std::string& path, const std::string& field, int64_t seq_len,
    int64_t vocab_size);

// Validates the source's fields (spec/dataset_spec.h) and loads both
// shards.
absl::StatusOr<DatasetPair> OpenTokenShards(const v1::TokenShardSource& source);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_DATA_TOKEN_SHARDS_H_
