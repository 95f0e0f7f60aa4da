// Turning what a user hands `pipetrainctl submit` into a JobSpec: the file
// may hold a whole JobSpec or just the TrainingSpec that pipetrain-train
// takes, and flags may override the schedule knobs. Pure functions (but
// for reading the file); thread-safe.
#ifndef PIPETRAIN_SERVICES_CTL_JOB_INPUT_H_
#define PIPETRAIN_SERVICES_CTL_JOB_INPUT_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "pipetrain/v1/scheduler.pb.h"

namespace pipetrain {
namespace ctl {

// Parses protobuf JSON as a JobSpec when it is one with a `training` field;
// otherwise as a TrainingSpec wrapped in JobSpec.training: ParseJobSpecJson
// (spec/job_spec.h), the reading the REST gateway shares.
absl::StatusOr<v1::JobSpec> ParseJobInput(const std::string& json);

// Reads `path` and parses it with ParseJobInput; errors name the file.
absl::StatusOr<v1::JobSpec> ReadJobInput(const std::string& path);

// The user-facing names of a spec's schedule and wire dtype, for display
// (spec/vocabulary.h); "unknown(N)" for a value this build does not know,
// e.g. from a newer scheduler.
std::string ScheduleName(v1::ScheduleKindProto kind);
std::string WireName(v1::DType dtype);

// Flag overrides for a submitted spec; unset fields leave the spec alone.
struct JobOverrides {
  std::optional<int> num_stages;
  std::optional<std::string> schedule;
  std::optional<std::string> wire;
  // "none", "int8" or "int4": the quantization of both activations and
  // gradients on the wire (WireCompression); its other fields stay.
  std::optional<std::string> wire_compression;
};

// InvalidArgument for an unknown schedule, dtype or quantization name. Values
// are not checked against each other here; ValidateJobSpec does that.
absl::Status ApplyJobOverrides(const JobOverrides& overrides,
                               v1::JobSpec* spec);

// What `submit` sends: the file read with ReadJobInput, the overrides
// applied, and the result checked with ValidateJobSpec (spec/job_spec.h),
// so a bad job fails here with the scheduler's own message.
absl::StatusOr<v1::JobSpec> LoadJob(const std::string& path,
                                    const JobOverrides& overrides);

}  // namespace ctl
}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_CTL_JOB_INPUT_H_
