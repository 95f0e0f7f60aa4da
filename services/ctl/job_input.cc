#include "services/ctl/job_input.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "spec/job_spec.h"
#include "spec/vocabulary.h"

namespace pipetrain {
namespace ctl {
absl::StatusOr<v1::JobSpec> ParseJobInput(const std::string& json) {
  return ParseJobSpecJson(json);
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

std::string ScheduleName(v1::ScheduleKindProto kind) {
  const absl::StatusOr<ScheduleKind> known = ScheduleKindFromProto(kind);
  if (!known.ok()) return absl::StrCat("unknown(", static_cast<int>(kind), ")");
  return ScheduleKindName(*known);
}

std::string WireName(v1::DType dtype) {
  const absl::StatusOr<DType> known = DTypeFromProto(dtype);
  if (!known.ok())
    return absl::StrCat("unknown(", static_cast<int>(dtype), ")");
  return DTypeName(*known);
}

absl::Status ApplyJobOverrides(const JobOverrides& overrides,
                               v1::JobSpec* spec) {
  if (overrides.num_stages.has_value()) {
    spec->set_num_stages(*overrides.num_stages);
  }
  if (overrides.schedule.has_value()) {
    ASSIGN_OR_RETURN(ScheduleKind kind, ParseScheduleKind(*overrides.schedule));
    spec->set_schedule(ScheduleKindToProto(kind));
  }
  if (overrides.wire.has_value()) {
    ASSIGN_OR_RETURN(DType dtype, ParseDTypeName(*overrides.wire));
    spec->set_wire_dtype(DTypeToProto(dtype));
  }
  if (overrides.wire_compression.has_value()) {
    ASSIGN_OR_RETURN(v1::WireQuantization q,
                     ParseWireQuantization(*overrides.wire_compression));
    spec->mutable_wire_compression()->set_activations(q);
    spec->mutable_wire_compression()->set_gradients(q);
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::JobSpec> LoadJob(const std::string& path,
                                    const JobOverrides& overrides) {
  ASSIGN_OR_RETURN(v1::JobSpec spec, ReadJobInput(path));
  RETURN_IF_ERROR(ApplyJobOverrides(overrides, &spec));
  RETURN_IF_ERROR(ValidateJobSpec(spec));
  return spec;
}

}  // namespace ctl
}  // namespace pipetrain
