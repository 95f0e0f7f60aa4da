// TrainingSpec.init_from: where a job's starting weights come from, and
// whether saved weights fit the job's model. One place parses the field
// (spec validation at submit, the scheduler at launch) and one place
// decides what "the same model" means.
//
//   "model.safetensors"  a pipetrain export (a path under the scheduler's
//                        models directory): parameters only, so the job
//                        fine-tunes: step 0, a fresh optimizer.
//   "job:ID"             job ID's latest committed checkpoint, and
//   "job:ID@VERSION"     its checkpoint of that weight version: parameters,
//                        optimizer state and step, so the job continues
//                        from that step (to its own `steps`).
//
// Pure functions; thread-safe.
#ifndef PIPETRAIN_SPEC_INIT_FROM_H_
#define PIPETRAIN_SPEC_INIT_FROM_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipetrain/v1/job.pb.h"
#include "pipetrain/v1/model.pb.h"

namespace pipetrain {

inline constexpr char kInitFromJobPrefix[] = "job:";

struct InitSource {
  enum class Kind { kFile, kCheckpoint };
  Kind kind = Kind::kFile;
  std::string path;     // kFile: as written in the spec
  std::string job_id;   // kCheckpoint
  int64_t version = 0;  // kCheckpoint: 0 means the latest committed
};

// Parses a non-empty init_from. InvalidArgument naming the value for an
// empty job id, a version that is not a positive integer, or an empty path.
absl::StatusOr<InitSource> ParseInitFrom(const std::string& init_from);

// OK when saved parameters of `saved` load into `model` layer for layer:
// the same input, the same number of layers, each of the same kind with
// the same parameter shapes (a linear layer's features and bias, a layer
// norm's features, an embedding's or attention's sizes). Settings without
// parameters (dropout rate, layer norm eps, names) may differ.
// InvalidArgument naming the first layer that differs.
absl::Status CheckSameParameters(const v1::ModelSpec& model,
                                 const v1::ModelSpec& saved);

}  // namespace pipetrain

#endif  // PIPETRAIN_SPEC_INIT_FROM_H_
