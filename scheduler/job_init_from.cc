// SchedulerCore's initFrom: the state a job starts from when its spec
// names a model export or another job's checkpoint (spec/init_from.h).
// An export holds parameters only: the job fine-tunes from step 0 with a
// fresh optimizer. A checkpoint holds the optimizer state and step too:
// the job continues from that step, as a recovery would, under its own
// partition and schedule. Export files are read only from the models
// directory (SchedulerOptions::models_dir): specs come from users over
// the network, and the scheduler must not open any file they name.
#include <cerrno>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "scheduler/model_export.h"
#include "scheduler/scheduler_core.h"
#include "spec/init_from.h"

namespace pipetrain {
namespace {

// An export larger than this is refused before it is read (the file is
// held in memory while the stages are configured).
constexpr uint64_t kMaxInitFileBytes = uint64_t{8} << 30;

absl::StatusOr<std::string> RealPath(const std::string& path) {
  char* resolved = ::realpath(path.c_str(), nullptr);
  if (resolved == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot resolve ", path));
  }
  std::string out(resolved);
  std::free(resolved);
  return out;
}

// `path` (relative to `dir`, or absolute) resolved, when it lies inside
// `dir` once every symlink and `..` is followed.
absl::StatusOr<std::string> ResolveModelFile(const std::string& dir,
                                             const std::string& path) {
  if (dir.empty()) {
    return absl::FailedPreconditionError(
        "this scheduler reads no model files (it has no data directory)");
  }
  absl::StatusOr<std::string> root = RealPath(dir);
  if (!root.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the models directory ", dir,
                     " is missing: ", root.status().message()));
  }
  const std::string full =
      absl::StartsWith(path, "/") ? path : absl::StrCat(dir, "/", path);
  absl::StatusOr<std::string> resolved = RealPath(full);
  if (absl::IsNotFound(resolved.status())) {
    return absl::NotFoundError(
        absl::StrCat("no such file ", full, " (export files go in ", dir, ")"));
  }
  RETURN_IF_ERROR(resolved.status());
  if (!absl::StartsWith(*resolved, *root + "/")) {
    return absl::PermissionDeniedError(
        absl::StrCat(full, " is outside the scheduler's models directory ", dir,
                     "; initFrom reads export files only from there"));
  }
  return resolved;
}

// `status` with the init_from value before its message, same code.
absl::Status About(const std::string& init_from, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("init_from \"", init_from,
                                                  "\": ", status.message()));
}

std::string Versions(const std::vector<CheckpointInfo>& list) {
  std::vector<int64_t> versions;
  for (const CheckpointInfo& c : list) versions.push_back(c.version);
  return versions.empty() ? "none" : absl::StrJoin(versions, ", ");
}

std::string OptimizerName(const v1::OptimizerSpec& optimizer) {
  const google::protobuf::FieldDescriptor* field =
      optimizer.GetDescriptor()->FindFieldByNumber(optimizer.kind_case());
  return field == nullptr ? "none" : field->name();
}

// A checkpoint continues a job when its model fits layer for layer, its
// optimizer state is of the job's optimizer, and steps are left to train.
absl::Status CheckCheckpointFits(const v1::TrainingSpec& job,
                                 const LoadedCheckpoint& c) {
  const std::string what = absl::StrCat("checkpoint ", c.info.version,
                                        " of job ", c.info.job_id, ": ");
  v1::TrainingSpec saved;
  if (absl::Status s = ParseJson(c.spec_json, &saved); !s.ok()) {
    return absl::DataLossError(
        absl::StrCat(what, "its training spec does not parse: ", s.message()));
  }
  if (absl::Status s = CheckSameParameters(job.model(), saved.model());
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, s.message()));
  }
  if (job.optimizer().kind_case() != saved.optimizer().kind_case()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, "it holds ", OptimizerName(saved.optimizer()),
        " optimizer state and this job uses ", OptimizerName(job.optimizer()),
        "; to fine-tune with another optimizer, export the checkpoint and "
        "start from the file"));
  }
  if (job.steps() > 0 && job.steps() <= c.info.step) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "it is at step ", c.info.step, " and steps ",
                     job.steps(), " leaves nothing to train (a continued job ",
                     "counts steps from the start of the first)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SchedulerCore::ResumePoint> SchedulerCore::LoadInitFrom(
    const v1::JobSpec& spec) {
  const std::string& init_from = spec.training().init_from();
  absl::StatusOr<InitSource> source = ParseInitFrom(init_from);
  RETURN_IF_ERROR(source.status());
  ResumePoint out;
  if (source->kind == InitSource::Kind::kFile) {
    absl::StatusOr<std::string> path =
        ResolveModelFile(options_.models_dir, source->path);
    if (!path.ok()) return About(init_from, path.status());
    absl::StatusOr<ExportedModel> model =
        ReadModelExportFor(*path, spec.training().model(), kMaxInitFileBytes);
    if (!model.ok()) return About(init_from, model.status());
    out.state = std::move(model->tensors);
    out.source =
        absl::StrCat("the export ", source->path, " (job ", model->info.job_id,
                     ", step ", model->info.step, ")");
    return out;
  }
  {
    absl::MutexLock lock(&mu_);
    if (!jobs_.Find(source->job_id).ok()) {
      return About(init_from, absl::NotFoundError(
                                  absl::StrCat("no job ", source->job_id)));
    }
  }
  CheckpointStore* store = options_.checkpoints;
  if (store == nullptr) {
    return About(
        init_from,
        absl::FailedPreconditionError(
            "this scheduler keeps no checkpoints (no data directory)"));
  }
  ASSIGN_OR_RETURN(std::vector<CheckpointInfo> list,
                   store->List(source->job_id));
  int64_t version = source->version;
  if (version == 0 && !list.empty()) version = list.front().version;
  bool listed = false;
  for (const CheckpointInfo& c : list) listed = listed || c.version == version;
  if (!listed) {
    return About(init_from,
                 absl::NotFoundError(absl::StrCat(
                     "job ", source->job_id, " has no committed checkpoint",
                     version == 0 ? "" : absl::StrCat(" of version ", version),
                     " (committed: ", Versions(list), ")")));
  }
  absl::StatusOr<LoadedCheckpoint> loaded =
      store->Load(source->job_id, version);
  if (!loaded.ok()) return About(init_from, loaded.status());
  if (absl::Status fits = CheckCheckpointFits(spec.training(), *loaded);
      !fits.ok()) {
    return About(init_from, fits);
  }
  out.step = loaded->info.step;
  out.version = loaded->info.version;
  out.info = {out.step, out.version, loaded->info.optimizer_steps};
  out.state = std::move(loaded->tensors);
  out.source = absl::StrCat("checkpoint ", version, " of job ", source->job_id,
                            " at step ", out.step);
  return out;
}

void SchedulerCore::NoteInitialState(const ResumePoint& init, JobRecord* r) {
  v1::Job& job = r->job;
  job.set_step(init.step);
  job.set_committed_version(init.version);
  r->last_checkpoint_step = init.step;
  absl::StatusOr<InitSource> source =
      ParseInitFrom(job.spec().training().init_from());
  if (source.ok() && source->kind == InitSource::Kind::kCheckpoint &&
      source->version == 0) {
    job.mutable_spec()->mutable_training()->set_init_from(
        absl::StrCat(kInitFromJobPrefix, source->job_id, "@", init.version));
  }
  PT_LOG(INFO) << job.id() << " starts at step " << init.step << " from "
               << init.source;
}

}  // namespace pipetrain
