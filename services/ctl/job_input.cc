#include "services/ctl/job_input.h"

#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/proto_json.h"

namespace pipetrain {
namespace ctl {
namespace {

const std::vector<std::pair<std::string, v1::ScheduleKindProto>>&
ScheduleNames() {
  static const auto* const kNames =
      new std::vector<std::pair<std::string, v1::ScheduleKindProto>>{
          {"gpipe", v1::SCHEDULE_GPIPE},
          {"1f1b-flush", v1::SCHEDULE_1F1B_FLUSH},
          {"interleaved", v1::SCHEDULE_INTERLEAVED},
          {"zb-h1", v1::SCHEDULE_ZB_H1},
          {"1f1b-async", v1::SCHEDULE_ASYNC_1F1B},
          {"2bw", v1::SCHEDULE_2BW}};
  return *kNames;
}

const std::vector<std::pair<std::string, v1::DType>>& WireNames() {
  static const auto* const kNames =
      new std::vector<std::pair<std::string, v1::DType>>{
          {"f32", v1::DTYPE_F32},
          {"bf16", v1::DTYPE_BF16},
          {"f16", v1::DTYPE_F16}};
  return *kNames;
}

template <typename T>
absl::StatusOr<T> Lookup(const std::vector<std::pair<std::string, T>>& names,
                         const std::string& what, const std::string& name) {
  std::vector<std::string> known;
  for (const auto& [n, value] : names) {
    if (n == name) return value;
    known.push_back(n);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown ", what, " '", name, "' (one of ",
                   absl::StrJoin(known, ", "), ")"));
}

template <typename T>
std::string NameOf(const std::vector<std::pair<std::string, T>>& names,
                   T value) {
  for (const auto& [n, v] : names) {
    if (v == value) return n;
  }
  return absl::StrCat("unknown(", static_cast<int>(value), ")");
}

}  // namespace

absl::StatusOr<v1::JobSpec> ParseJobInput(const std::string& json) {
  v1::JobSpec job;
  const absl::Status as_job = ParseJson(json, &job);
  if (as_job.ok() && job.has_training()) return job;
  v1::TrainingSpec training;
  const absl::Status as_training = ParseJson(json, &training);
  if (as_training.ok()) {
    // A JobSpec without `training` that also parses as a TrainingSpec can
    // only be "{}"; either reading gives the same (empty) job.
    v1::JobSpec wrapped;
    *wrapped.mutable_training() = std::move(training);
    return wrapped;
  }
  if (as_job.ok()) {
    return absl::InvalidArgumentError(
        "the JobSpec has no `training` (the model, data and optimizer)");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("neither a JobSpec nor a TrainingSpec: ", as_job.message(),
                   "; ", as_training.message()));
}

absl::StatusOr<v1::JobSpec> ReadJobInput(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  absl::StatusOr<v1::JobSpec> spec = ParseJobInput(buffer.str());
  if (!spec.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", spec.status().message()));
  }
  return spec;
}

absl::StatusOr<v1::ScheduleKindProto> ParseScheduleName(
    const std::string& name) {
  return Lookup(ScheduleNames(), "schedule", name);
}

std::string ScheduleName(v1::ScheduleKindProto kind) {
  return NameOf(ScheduleNames(), kind);
}

absl::StatusOr<v1::DType> ParseWireName(const std::string& name) {
  return Lookup(WireNames(), "wire dtype", name);
}

std::string WireName(v1::DType dtype) { return NameOf(WireNames(), dtype); }

absl::Status ApplyJobOverrides(const JobOverrides& overrides,
                               v1::JobSpec* spec) {
  if (overrides.num_stages.has_value()) {
    if (*overrides.num_stages < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stages must be 0 (let the planner choose) or more, "
                       "not ",
                       *overrides.num_stages));
    }
    spec->set_num_stages(*overrides.num_stages);
  }
  if (overrides.schedule.has_value()) {
    ASSIGN_OR_RETURN(v1::ScheduleKindProto kind,
                     ParseScheduleName(*overrides.schedule));
    spec->set_schedule(kind);
  }
  if (overrides.wire.has_value()) {
    ASSIGN_OR_RETURN(v1::DType dtype, ParseWireName(*overrides.wire));
    spec->set_wire_dtype(dtype);
  }
  return absl::OkStatus();
}

}  // namespace ctl
}  // namespace pipetrain
