// Turning what a user hands `pipetrainctl submit` into a JobSpec: the file
// may hold a whole JobSpec or just the TrainingSpec that pipetrain-train
// takes, and flags may override the schedule knobs. Pure functions;
// thread-safe.
#ifndef PIPETRAIN_SERVICES_CTL_JOB_INPUT_H_
#define PIPETRAIN_SERVICES_CTL_JOB_INPUT_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "pipetrain/v1/scheduler.pb.h"

namespace pipetrain {
namespace ctl {

// Parses protobuf JSON as a JobSpec when it is one with a `training` field;
// otherwise as a TrainingSpec wrapped in JobSpec.training. InvalidArgument
// (with both parsers' complaints) when it is neither.
absl::StatusOr<v1::JobSpec> ParseJobInput(const std::string& json);

// Reads `path` and parses it with ParseJobInput; errors name the file.
absl::StatusOr<v1::JobSpec> ReadJobInput(const std::string& path);

// "gpipe", "1f1b-flush", "interleaved", "zb-h1" and back.
absl::StatusOr<v1::ScheduleKindProto> ParseScheduleName(
    const std::string& name);
std::string ScheduleName(v1::ScheduleKindProto kind);

// "f32", "bf16", "f16" and back.
absl::StatusOr<v1::DType> ParseWireName(const std::string& name);
std::string WireName(v1::DType dtype);

// Flag overrides for a submitted spec; unset fields leave the spec alone.
struct JobOverrides {
  std::optional<int> num_stages;
  std::optional<std::string> schedule;
  std::optional<std::string> wire;
};

// InvalidArgument for a negative stage count or an unknown name.
absl::Status ApplyJobOverrides(const JobOverrides& overrides,
                               v1::JobSpec* spec);

}  // namespace ctl
}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_CTL_JOB_INPUT_H_
