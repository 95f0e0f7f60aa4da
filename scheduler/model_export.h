// Model export files: one safetensors file with every layer's parameters
// (no optimizer state), loadable by any safetensors reader (PyTorch,
// NumPy), and read back by `initFrom`. Metadata:
//   format         "pipetrain-export-v1"
//   model_spec     the ModelSpec as JSON (the REST API's form)
//   training_spec  the job's whole TrainingSpec as JSON
//   job_id, step, version
//
// Free functions; thread-compatible.
#ifndef PIPETRAIN_SCHEDULER_MODEL_EXPORT_H_
#define PIPETRAIN_SCHEDULER_MODEL_EXPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/safetensors.h"
#include "pipetrain/v1/model.pb.h"
#include "scheduler/state_tensor.h"

namespace pipetrain {

inline constexpr char kExportFormat[] = "pipetrain-export-v1";

struct ExportInfo {
  std::string job_id;
  int64_t step = 0;
  int64_t version = 0;
  std::string training_spec_json;  // a TrainingSpec as JSON
};

// Writes the export of `state` (parameters are kept, optimizer tensors
// dropped) to `sink`. InvalidArgument when the spec is not a TrainingSpec
// or a tensor is malformed (see WriteSafetensors).
absl::Status WriteModelExport(const std::vector<StateTensor>& state,
                              const ExportInfo& info, const ByteSink& sink);

// A tensor the caller's model has, for checking a file against it.
struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
};

struct ExportedModel {
  ExportInfo info;
  std::string model_spec_json;
  std::vector<StateTensor> tensors;  // in the order of `expected`
};

// Checks an export against the model that will load it: the format tag,
// every expected tensor present as F32 with the expected shape, and no
// other tensor (a file of another model). InvalidArgument saying what
// differs (the first few names).
absl::StatusOr<ExportedModel> ParseModelExport(
    const SafetensorsFile& file, const std::vector<ExpectedTensor>& expected);

// Reads and checks the export at `path` (at most `max_bytes`); errors are
// prefixed with the path.
absl::StatusOr<ExportedModel> ReadModelExport(
    const std::string& path, const std::vector<ExpectedTensor>& expected,
    uint64_t max_bytes);

// Reads the export at `path` for a job whose model is `model` (initFrom):
// the export checks above, with the file's own tensors as the expected
// ones, and its model_spec metadata fitting `model` layer for layer
// (spec/init_from.h CheckSameParameters). Stages check every tensor's
// name and shape again when they restore. Errors are prefixed with the
// path.
absl::StatusOr<ExportedModel> ReadModelExportFor(const std::string& path,
                                                 const v1::ModelSpec& model,
                                                 uint64_t max_bytes);

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_MODEL_EXPORT_H_
