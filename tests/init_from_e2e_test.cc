// Export and initFrom end to end: a scheduler and three workers on loopback
// train the Fashion-MNIST MLP.
// - A finished job's export (no version: the final checkpoint, the weights
//   after the last step) is read by an independent reader in Python with
//   NumPy (tests/testdata/export_accuracy.py: its own safetensors parsing
//   and forward pass over the IDX test files), whose test accuracy equals
//   the job's end-of-job evaluation within 0.1 percentage points.
// - N/2 steps, then a job continuing from that job's checkpoint to N under
//   another partition and schedule, ends with the weights of an
//   uninterrupted N-step run within 1e-5 (absolute).
// - A job fine-tuning from an export under another partition and schedule
//   equals the in-process trainer started from the export's parameters
//   within 1e-5 (absolute).
// - Bad sources are refused at submit, each naming the source and what is
//   wrong; the scheduler goes on serving.
#include <stdio.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/rpc/grpc_util.h"
#include "tests/scheduler_cluster.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/data/fashion_mnist.h"
#include "worker/nn/model_state.h"
#include "worker/nn/optimizer.h"
#include "worker/pipeline/local_trainer.h"

namespace pipetrain::testing {
namespace {

using ::testing::HasSubstr;

// The pipeline equals the in-process trainer up to float summation order.
constexpr double kWeightAbs = 1e-5;
// Accuracy as a fraction: 0.1 percentage points.
constexpr double kAccuracyAbs = 0.001;

using Weights = std::map<std::string, std::vector<float>>;

Weights ReadWeights(const std::string& path, int64_t* step) {
  Weights out;
  absl::StatusOr<SafetensorsFile> file = ReadSafetensorsFile(path, 1 << 30);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return out;
  if (step != nullptr) *step = std::stoll(file->metadata().at("step"));
  for (const SafetensorsEntry& t : file->tensors()) {
    const absl::string_view data = file->Data(t);
    const float* f = reinterpret_cast<const float*>(data.data());
    out[t.name] = std::vector<float>(f, f + data.size() / sizeof(float));
  }
  return out;
}

void ExpectSameWeights(const Weights& got, const Weights& want,
                       const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, w] : want) {
    auto g = got.find(name);
    ASSERT_NE(g, got.end()) << what << ": no " << name;
    ASSERT_EQ(g->second.size(), w.size()) << what << ": " << name;
    for (size_t i = 0; i < w.size(); ++i) {
      ASSERT_LE(std::fabs(g->second[i] - w[i]), kWeightAbs)
          << what << ": " << name << "[" << i << "] is " << g->second[i]
          << ", expected " << w[i] << " (absolute tolerance " << kWeightAbs
          << ")";
    }
  }
}

// The in-process trainer of `spec` started from the parameters in `init`
// (an export, checkpoint layout) with a fresh optimizer: its evaluation
// before training, then its parameters after spec.steps() steps.
struct InProcessFineTune {
  EvalReport before;
  Weights after;
};
InProcessFineTune FineTuneInProcess(const v1::TrainingSpec& spec,
                                    const Weights& init) {
  InProcessFineTune out;
  auto backend = CreateCpuBackend(1);
  auto trainer = LocalTrainer::Create(spec, backend.get());
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return out;
  TrainingState state;
  for (const auto& [name, values] : init) {
    absl::StatusOr<StateName> parsed = ParseStateName(name);
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    // The checkpoint shape of every parameter of this MLP: a linear's
    // weight [out, in], its bias [out].
    const v1::LinearSpec& linear = spec.model().layers(parsed->layer).linear();
    Shape shape = parsed->param == "weight"
                      ? Shape{linear.out_features(), linear.in_features()}
                      : Shape{linear.out_features()};
    state.tensors.emplace(name, Tensor::HostFrom(shape, values));
  }
  auto scratch = Optimizer::Create(spec.optimizer(), backend.get());
  EXPECT_TRUE(scratch.ok()) << scratch.status();
  if (!scratch.ok()) return out;
  const absl::Status imported = ImportTrainingState(
      state, {(*trainer)->model()}, scratch->get(), backend.get());
  EXPECT_TRUE(imported.ok()) << imported;
  auto before = (*trainer)->Evaluate();
  EXPECT_TRUE(before.ok()) << before.status();
  if (before.ok()) out.before = *before;
  for (int64_t i = 0; i < spec.steps(); ++i) {
    auto step = (*trainer)->Step();
    EXPECT_TRUE(step.ok()) << step.status();
    if (!step.ok()) return out;
  }
  auto exported =
      ExportTrainingState({(*trainer)->model()}, **scratch, backend.get());
  EXPECT_TRUE(exported.ok()) << exported.status();
  if (!exported.ok()) return out;
  for (const auto& [name, t] : exported->tensors) {
    if (name.rfind("optimizer.", 0) == 0) continue;
    out.after[name] = t.ToVector();
  }
  return out;
}

class InitFromE2eTest : public SchedulerTest {
 protected:
  std::string ModelsDir() const { return dir_.path() + "/models"; }

  v1::JobSpec Job(v1::TrainingSpec training, int stages,
                  v1::ScheduleKindProto schedule) {
    v1::JobSpec spec;
    *spec.mutable_training() = std::move(training);
    spec.set_num_stages(stages);
    spec.set_schedule(schedule);
    return spec;
  }

  v1::Job Complete(const v1::JobSpec& spec) {
    const v1::Job job = Submit(spec);
    const v1::Job done = WaitForState(job.id(), v1::JOB_STATE_COMPLETED, 300);
    EXPECT_EQ(done.state(), v1::JOB_STATE_COMPLETED) << done.error();
    return done;
  }

  grpc::Status TrySubmit(const v1::JobSpec& spec) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(30));
    v1::SubmitJobRequest q;
    *q.mutable_spec() = spec;
    v1::Job job;
    return scheduler_.stub->SubmitJob(&ctx, q, &job);
  }

  // The job's export (`version` 0: the latest checkpoint) written to `path`.
  void Export(const std::string& job_id, const std::string& path,
              int64_t version = 0) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(60));
    v1::ExportModelRequest q;
    q.set_job_id(job_id);
    q.set_version(version);
    auto reader = scheduler_.stub->ExportModel(&ctx, q);
    std::ofstream out(path, std::ios::binary);
    v1::ExportModelChunk chunk;
    while (reader->Read(&chunk)) out << chunk.data();
    const grpc::Status s = reader->Finish();
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
};

// Runs the independent reader; its JSON answer, or a test failure.
nlohmann::json PythonAccuracy(const std::string& model) {
  const std::string command = absl::StrCat(
      "/usr/bin/python3 ", SourcePath("tests/testdata/export_accuracy.py"), " ",
      model, " ", kDefaultFashionMnistDir);
  FILE* pipe = popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr) << command;
  if (pipe == nullptr) return {};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int status = pclose(pipe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << command << " failed (is python3-numpy installed?)";
  return nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
}

TEST_F(InitFromE2eTest, TheExportHasTheAccuracyTheJobEvaluated) {
  constexpr int64_t kSteps = 300;
  const v1::Job done = Complete(Job(MlpSpec(kSteps), 3, v1::SCHEDULE_GPIPE));
  ASSERT_EQ(done.state(), v1::JOB_STATE_COMPLETED);
  ASSERT_EQ(done.eval().step(), kSteps);
  ASSERT_EQ(done.eval().samples(), 10000);
  const std::string path = dir_.path() + "/mlp.safetensors";
  Export(done.id(), path);
  int64_t step = 0;
  ReadWeights(path, &step);
  EXPECT_EQ(step, kSteps) << "the export is not of the final step";
  const nlohmann::json python = PythonAccuracy(path);
  ASSERT_TRUE(python.is_object()) << python;
  std::printf("pipetrain evaluated %.4f, the NumPy reader %.4f on %d samples\n",
              done.eval().accuracy(), python["accuracy"].get<double>(),
              python["samples"].get<int>());
  EXPECT_EQ(python["samples"].get<int64_t>(), done.eval().samples());
  EXPECT_NEAR(python["accuracy"].get<double>(), done.eval().accuracy(),
              kAccuracyAbs);
  EXPECT_GT(done.eval().accuracy(), 0.7);  // it trained
}

TEST_F(InitFromE2eTest, ContinuingFromACheckpointEqualsAnUninterruptedRun) {
  constexpr int64_t kSteps = 120;
  const v1::Job whole = Complete(Job(MlpSpec(kSteps), 3, v1::SCHEDULE_GPIPE));
  const v1::Job half =
      Complete(Job(MlpSpec(kSteps / 2), 3, v1::SCHEDULE_GPIPE));
  v1::TrainingSpec rest = MlpSpec(kSteps);
  rest.set_init_from("job:" + half.id());
  const v1::Job continued = Complete(Job(rest, 2, v1::SCHEDULE_1F1B_FLUSH));
  ASSERT_EQ(continued.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(continued.step(), kSteps);
  EXPECT_EQ(GetPlan(continued.id()).stages_size(), 2);
  // "latest" was pinned to the checkpoint loaded: the half job's last step.
  EXPECT_THAT(continued.spec().training().init_from(),
              HasSubstr("job:" + half.id() + "@"));
  Export(whole.id(), dir_.path() + "/whole.safetensors");
  Export(continued.id(), dir_.path() + "/continued.safetensors");
  int64_t step = 0;
  const Weights want = ReadWeights(dir_.path() + "/whole.safetensors", &step);
  EXPECT_EQ(step, kSteps);
  const Weights got =
      ReadWeights(dir_.path() + "/continued.safetensors", &step);
  EXPECT_EQ(step, kSteps);
  ExpectSameWeights(got, want, "continued from the checkpoint");
}

TEST_F(InitFromE2eTest, FineTuningFromAnExportEqualsTheInProcessTrainer) {
  const v1::Job base = Complete(Job(MlpSpec(60), 3, v1::SCHEDULE_GPIPE));
  ASSERT_EQ(base.state(), v1::JOB_STATE_COMPLETED);
  Export(base.id(), ModelsDir() + "/base.safetensors");
  const Weights exported =
      ReadWeights(ModelsDir() + "/base.safetensors", nullptr);
  v1::TrainingSpec tune = MlpSpec(20);
  tune.set_seed(7);  // other data order: a fine-tune, not a continuation
  tune.set_init_from("base.safetensors");
  const v1::Job done = Complete(Job(tune, 2, v1::SCHEDULE_ZB_H1));
  ASSERT_EQ(done.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(done.step(), 20);
  EXPECT_EQ(done.rollbacks_size(), 0);
  const std::string path = dir_.path() + "/tuned.safetensors";
  Export(done.id(), path);
  int64_t step = 0;
  const Weights got = ReadWeights(path, &step);
  EXPECT_EQ(step, 20);  // steps count from 0: a fine-tune starts afresh
  const InProcessFineTune want = FineTuneInProcess(tune, exported);
  // Started from the export, the in-process model is the base job's.
  EXPECT_NEAR(want.before.accuracy, base.eval().accuracy(), kAccuracyAbs);
  ExpectSameWeights(got, want.after, "fine-tuned from the export");
}

TEST_F(InitFromE2eTest, BadSourcesAreRefusedNamingWhatIsWrong) {
  const v1::Job base = Complete(Job(MlpSpec(20), 3, v1::SCHEDULE_GPIPE));
  ASSERT_EQ(base.state(), v1::JOB_STATE_COMPLETED);
  const std::string good = ModelsDir() + "/good.safetensors";
  Export(base.id(), good);
  std::string bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::ofstream(ModelsDir() + "/truncated.safetensors", std::ios::binary)
      << bytes.substr(0, bytes.size() / 2);
  std::ofstream(ModelsDir() + "/garbage.safetensors") << "not a model";
  std::ofstream(dir_.path() + "/outside.safetensors", std::ios::binary)
      << bytes;
  struct Case {
    std::string init_from;
    grpc::StatusCode code;
    std::string says;
    bool other_model = false;
    bool adamw = false;
    int64_t steps = 40;
  };
  const std::string job = "job:" + base.id();
  const std::vector<Case> cases = {
      {"missing.safetensors", grpc::NOT_FOUND, "no such file"},
      {"truncated.safetensors", grpc::INVALID_ARGUMENT,
       "truncated.safetensors: "},
      {"garbage.safetensors", grpc::INVALID_ARGUMENT, "garbage.safetensors: "},
      {"../outside.safetensors", grpc::PERMISSION_DENIED,
       "outside the scheduler's models directory"},
      {dir_.path() + "/outside.safetensors", grpc::PERMISSION_DENIED,
       "outside the scheduler's models directory"},
      {"good.safetensors", grpc::INVALID_ARGUMENT, "layer 0 differs", true},
      {"job:job-999", grpc::NOT_FOUND, "no job job-999"},
      {job + "@999", grpc::NOT_FOUND,
       "has no committed checkpoint of version 999"},
      {job, grpc::INVALID_ARGUMENT, "layer 0 differs", true},
      {job, grpc::INVALID_ARGUMENT, "holds sgd optimizer state", false, true},
      {job, grpc::INVALID_ARGUMENT, "leaves nothing to train", false, false,
       20},
      {"job:", grpc::INVALID_ARGUMENT, "no job id"},
  };
  for (const Case& c : cases) {
    v1::TrainingSpec spec = MlpSpec(c.steps);
    spec.set_init_from(c.init_from);
    if (c.other_model) {
      spec.mutable_model()
          ->mutable_layers(0)
          ->mutable_linear()
          ->set_out_features(64);
      spec.mutable_model()
          ->mutable_layers(2)
          ->mutable_linear()
          ->set_in_features(64);
    }
    if (c.adamw) spec.mutable_optimizer()->mutable_adamw()->set_lr(1e-3);
    const grpc::Status s = TrySubmit(Job(spec, 3, v1::SCHEDULE_GPIPE));
    EXPECT_EQ(s.error_code(), c.code)
        << c.init_from << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.says)) << c.init_from;
    EXPECT_THAT(s.error_message(), HasSubstr("init_from")) << c.init_from;
  }
  // Nothing crashed: the scheduler serves, and a good source trains.
  v1::TrainingSpec ok = MlpSpec(40);
  ok.set_init_from("good.safetensors");
  EXPECT_EQ(Complete(Job(ok, 3, v1::SCHEDULE_GPIPE)).state(),
            v1::JOB_STATE_COMPLETED);
}

}  // namespace
}  // namespace pipetrain::testing
