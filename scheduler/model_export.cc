#include "scheduler/model_export.h"

#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "pipetrain/v1/job.pb.h"
#include "spec/init_from.h"

namespace pipetrain {
namespace {

// At most this many names in an error message.
constexpr size_t kNamesShown = 5;

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string Names(const std::vector<std::string>& names) {
  std::vector<std::string> shown(
      names.begin(), names.begin() + std::min(names.size(), kNamesShown));
  std::string out = absl::StrJoin(shown, ", ");
  if (names.size() > kNamesShown) {
    absl::StrAppend(&out, " and ", names.size() - kNamesShown, " more");
  }
  return out;
}

absl::StatusOr<int64_t> IntMetadata(const SafetensorsMetadata& metadata,
                                    const std::string& key) {
  auto it = metadata.find(key);
  int64_t v = 0;
  if (it == metadata.end() || !absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata \"", key, "\" is missing or not an integer"));
  }
  return v;
}

// Every expected tensor must be there with its shape; nothing else may be.
absl::Status CheckTensors(const SafetensorsFile& file,
                          const std::vector<ExpectedTensor>& expected) {
  std::vector<std::string> missing, unexpected, mismatched;
  std::set<std::string> wanted;
  for (const ExpectedTensor& e : expected) {
    wanted.insert(e.name);
    const SafetensorsEntry* t = file.Find(e.name);
    if (t == nullptr) {
      missing.push_back(e.name);
    } else if (t->dtype != SafetensorsDtype::kF32 || t->shape != e.shape) {
      mismatched.push_back(
          absl::StrCat(e.name, " is ", SafetensorsDtypeName(t->dtype), " ",
                       ShapeString(t->shape), " but the model needs F32 ",
                       ShapeString(e.shape)));
    }
  }
  for (const SafetensorsEntry& t : file.tensors()) {
    if (wanted.count(t.name) == 0) unexpected.push_back(t.name);
  }
  if (missing.empty() && unexpected.empty() && mismatched.empty()) {
    return absl::OkStatus();
  }
  std::vector<std::string> problems;
  if (!mismatched.empty()) problems.push_back(Names(mismatched));
  if (!missing.empty()) {
    problems.push_back(absl::StrCat("missing ", Names(missing)));
  }
  if (!unexpected.empty()) {
    problems.push_back(
        absl::StrCat("tensors the model does not have: ", Names(unexpected)));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "the file holds another model: ", absl::StrJoin(problems, "; ")));
}

}  // namespace

absl::Status WriteModelExport(const std::vector<StateTensor>& state,
                              const ExportInfo& info, const ByteSink& sink) {
  v1::TrainingSpec spec;
  RETURN_IF_ERROR(ParseJson(info.training_spec_json, &spec));
  const SafetensorsMetadata metadata = {
      {"format", kExportFormat},
      {"model_spec", ToApiJson(spec.model())},
      {"training_spec", info.training_spec_json},
      {"job_id", info.job_id},
      {"step", absl::StrCat(info.step)},
      {"version", absl::StrCat(info.version)},
  };
  std::vector<SafetensorsTensorView> views;
  for (const StateTensor& t : state) {
    if (!IsParameterName(t.name)) continue;
    views.push_back({t.name, SafetensorsDtype::kF32, t.shape, t.data});
  }
  return WriteSafetensors(views, metadata, sink);
}

absl::StatusOr<ExportedModel> ParseModelExport(
    const SafetensorsFile& file, const std::vector<ExpectedTensor>& expected) {
  const SafetensorsMetadata& m = file.metadata();
  auto format = m.find("format");
  if (format == m.end() || format->second != kExportFormat) {
    return absl::InvalidArgumentError(absl::StrCat(
        "not a pipetrain model export (metadata \"format\" is ",
        format == m.end() ? "missing" : "\"" + format->second + "\"",
        ", expected \"", kExportFormat, "\")"));
  }
  RETURN_IF_ERROR(CheckTensors(file, expected));
  ExportedModel model;
  ASSIGN_OR_RETURN(model.info.step, IntMetadata(m, "step"));
  ASSIGN_OR_RETURN(model.info.version, IntMetadata(m, "version"));
  if (auto it = m.find("job_id"); it != m.end()) model.info.job_id = it->second;
  if (auto it = m.find("training_spec"); it != m.end()) {
    model.info.training_spec_json = it->second;
  }
  if (auto it = m.find("model_spec"); it != m.end()) {
    model.model_spec_json = it->second;
  }
  for (const ExpectedTensor& e : expected) {
    const SafetensorsEntry* t = file.Find(e.name);
    model.tensors.push_back({e.name, e.shape, std::string(file.Data(*t))});
  }
  return model;
}

absl::StatusOr<ExportedModel> ReadModelExport(
    const std::string& path, const std::vector<ExpectedTensor>& expected,
    uint64_t max_bytes) {
  ASSIGN_OR_RETURN(const SafetensorsFile file,
                   ReadSafetensorsFile(path, max_bytes));
  absl::StatusOr<ExportedModel> model = ParseModelExport(file, expected);
  if (!model.ok()) {
    return absl::Status(model.status().code(),
                        absl::StrCat(path, ": ", model.status().message()));
  }
  return model;
}

absl::StatusOr<ExportedModel> ReadModelExportFor(const std::string& path,
                                                 const v1::ModelSpec& model,
                                                 uint64_t max_bytes) {
  ASSIGN_OR_RETURN(const SafetensorsFile file,
                   ReadSafetensorsFile(path, max_bytes));
  std::vector<ExpectedTensor> own;
  for (const SafetensorsEntry& t : file.tensors()) {
    own.push_back({t.name, t.shape});
  }
  absl::StatusOr<ExportedModel> read = ParseModelExport(file, own);
  absl::Status fits = read.status();
  v1::ModelSpec saved;
  if (fits.ok() && read->model_spec_json.empty()) {
    fits = absl::InvalidArgumentError("metadata \"model_spec\" is missing");
  } else if (fits.ok()) {
    fits = ParseJson(read->model_spec_json, &saved);
    if (fits.ok()) fits = CheckSameParameters(model, saved);
  }
  if (!fits.ok()) {
    return absl::Status(fits.code(), absl::StrCat(path, ": ", fits.message()));
  }
  return read;
}

}  // namespace pipetrain
