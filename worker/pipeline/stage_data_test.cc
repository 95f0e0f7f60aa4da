// Each stage reads only its part of the data: stage 0 the inputs, the last
// stage the labels, middle stages nothing. The job's .npy files are given
// to each stage with the other part's files (all four for a middle stage)
// missing, so a stage that opened a file it should not would fail; the
// pipeline must still train and evaluate exactly like the in-process
// trainer on the whole files, and splits of different sizes on the two
// ends must fail naming both files.
#include "worker/pipeline/stage_data.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/temp_dir_for_test.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/pipeline/in_memory_pipeline.h"
#include "worker/pipeline/local_trainer.h"
#include "worker/pipeline/stage_config.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

// A .npy (format 1.0) of `shape` with dtype `descr`, as numpy.save writes
// it: the header dict padded with spaces and a newline to a multiple of 64.
void WriteNpy(const std::string& path, const std::string& descr,
              const std::vector<int64_t>& shape, const void* data,
              size_t bytes) {
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) {
    dims += absl::StrCat(i > 0 ? ", " : "", shape[i]);
  }
  if (shape.size() == 1) dims += ",";
  std::string dict =
      absl::StrCat("{'descr': '", descr,
                   "', 'fortran_order': False, 'shape': (", dims, "), }");
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string header("\x93NUMPY\x01\x00", 8);
  header += static_cast<char>(dict.size() & 0xff);
  header += static_cast<char>(dict.size() >> 8);
  std::ofstream out(path, std::ios::binary);
  out << header << dict;
  out.write(static_cast<const char*>(data),
            static_cast<std::streamsize>(bytes));
  ASSERT_TRUE(out.good()) << path;
}

// Writes the first `labels` samples' labels of `dataset` (all its inputs)
// as <prefix>-features.npy (float32 [N, F]) and <prefix>-labels.npy (int64).
void WriteSplit(const Dataset& dataset, const std::string& prefix,
                int64_t labels) {
  std::vector<int64_t> all(static_cast<size_t>(dataset.size()));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  absl::StatusOr<Batch> batch = GatherBatch(dataset, all);
  ASSERT_TRUE(batch.ok()) << batch.status();
  WriteNpy(prefix + "-features.npy", "<f4",
           {dataset.size(), NumElements(dataset.sample_shape())},
           batch->inputs.raw(), batch->inputs.bytes());
  std::vector<int64_t> ids(static_cast<size_t>(labels));
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int64_t>(batch->labels.f32()[i]);
  }
  WriteNpy(prefix + "-labels.npy", "<i8", {labels}, ids.data(),
           ids.size() * sizeof(int64_t));
}

class StageDataTest : public ::testing::Test {
 protected:
  // The small MLP's synthetic data written as .npy files: features and
  // labels of both splits (`short_*`: the labels of one split less one).
  void SetUp() override {
    synthetic_ = SmallMlpSpec(4, false);
    absl::StatusOr<DatasetPair> data =
        OpenDataset(synthetic_.data(), synthetic_.seed());
    ASSERT_TRUE(data.ok()) << data.status();
    WriteSplit(*data->train, Path("train"), data->train->size());
    WriteSplit(*data->eval, Path("eval"), data->eval->size());
    WriteSplit(*data->train, Path("short-train"), data->train->size() - 1);
    WriteSplit(*data->eval, Path("short-eval"), data->eval->size() - 1);
    spec_ = synthetic_;
    v1::NumpySource* n = spec_.mutable_data()->mutable_numpy();
    n->set_train_features(Path("train-features.npy"));
    n->set_train_labels(Path("train-labels.npy"));
    n->set_eval_features(Path("eval-features.npy"));
    n->set_eval_labels(Path("eval-labels.npy"));
    n->set_classes(synthetic_.data().synthetic().classes());
  }

  std::string Path(const std::string& name) const {
    return absl::StrCat(dir_.path(), "/", name);
  }

  // Points each stage only at the files of its part: the others' names
  // are files that do not exist.
  ConfigEdit OnlyItsPart() const {
    const std::string absent = Path("absent.npy");
    return [absent](v1::StageConfig* config) {
      const DataParts parts = StageDataParts(*config);
      v1::NumpySource* n =
          config->mutable_spec()->mutable_data()->mutable_numpy();
      if (!parts.inputs) {
        n->set_train_features(absent);
        n->set_eval_features(absent);
      }
      if (!parts.labels) {
        n->set_train_labels(absent);
        n->set_eval_labels(absent);
      }
    };
  }

  ScopedTempDir dir_;
  v1::TrainingSpec synthetic_;
  v1::TrainingSpec spec_;
};

// The reference: the in-process trainer on the whole files, its losses,
// weights (by parameter name) and evaluation after spec.steps().
struct Reference {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> weights;
  EvalReport evaluation;
};

Reference Train(const v1::TrainingSpec& spec) {
  Reference out;
  auto backend = CreateCpuBackend(1);
  auto trainer = LocalTrainer::Create(spec, backend.get());
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return out;
  for (int i = 0; i < spec.steps(); ++i) {
    absl::StatusOr<StepReport> r = (*trainer)->Step();
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return out;
    out.losses.push_back(r->loss);
  }
  auto weights = (*trainer)->model()->ParamsToHost();
  EXPECT_TRUE(weights.ok());
  for (size_t i = 0; i < weights->size(); ++i) {
    out.weights[(*trainer)->model()->params()[i]->name] =
        (*weights)[i].ToVector();
  }
  absl::StatusOr<EvalReport> evaluation = (*trainer)->Evaluate();
  EXPECT_TRUE(evaluation.ok()) << evaluation.status();
  if (evaluation.ok()) out.evaluation = *evaluation;
  return out;
}

void ExpectEqualsReference(Pipeline& p, const v1::TrainingSpec& spec,
                           const Reference& want) {
  ASSERT_TRUE(TrainAll(p, spec.steps()).ok());
  const v1::GetStatusResponse status = p.stages.back()->GetStatus(0);
  ASSERT_EQ(status.results_size(), spec.steps());
  for (int i = 0; i < spec.steps(); ++i) {
    EXPECT_NEAR(status.results(i).loss(), want.losses[i], 1e-5 * want.losses[i])
        << "step " << i;
  }
  const std::map<std::string, std::vector<float>> got = WeightsByName(p);
  ASSERT_EQ(got.size(), want.weights.size());
  for (const auto& [name, values] : want.weights) {
    const std::vector<float>& g = got.at(name);
    ASSERT_EQ(g.size(), values.size()) << name;
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_NEAR(g[i], values[i], 1e-5 * std::max(1.0f, std::fabs(values[i])))
          << name << "[" << i << "]";
    }
  }
  const std::vector<absl::StatusOr<v1::EvalResult>> evaluations =
      EvaluateAll(p, 0);
  for (size_t s = 0; s < evaluations.size(); ++s) {
    ASSERT_TRUE(evaluations[s].ok())
        << "stage " << s << ": " << evaluations[s].status();
  }
  const v1::EvalResult& last = *evaluations.back();
  EXPECT_EQ(last.samples(), want.evaluation.samples);
  EXPECT_NEAR(last.loss(), want.evaluation.loss, 1e-5 * want.evaluation.loss);
  EXPECT_NEAR(last.accuracy(), want.evaluation.accuracy,
              1e-5 * want.evaluation.accuracy);
}

TEST_F(StageDataTest, StagesGetOnlyTheirPart) {
  v1::StageConfig config;
  config.set_num_stages(3);
  for (int s = 0; s < 3; ++s) {
    config.set_stage(s);
    const DataParts parts = StageDataParts(config);
    EXPECT_EQ(parts.inputs, s == 0) << s;
    EXPECT_EQ(parts.labels, s == 2) << s;
  }
  config.set_num_stages(1);
  config.set_stage(0);
  EXPECT_TRUE(StageDataParts(config).inputs && StageDataParts(config).labels);
}

// The .npy files hold the synthetic data exactly, so the reference is the
// same on both.
TEST_F(StageDataTest, EachEndReadsOnlyItsFilesAndTrainsLikeTheReference) {
  const Reference want = Train(spec_);
  ASSERT_EQ(want.losses.size(), static_cast<size_t>(spec_.steps()));
  const Reference synthetic = Train(synthetic_);
  EXPECT_EQ(synthetic.losses, want.losses);
  for (v1::ScheduleKindProto schedule :
       {v1::SCHEDULE_GPIPE, v1::SCHEDULE_1F1B_FLUSH, v1::SCHEDULE_ZB_H1}) {
    SCOPED_TRACE(v1::ScheduleKindProto_Name(schedule));
    Pipeline p =
        BuildPipeline(spec_, {2, 5}, schedule, false, {}, OnlyItsPart());
    ASSERT_EQ(p.stages.size(), 3u);
    ExpectEqualsReference(p, spec_, want);
  }
}

// Interleaved: worker 0 holds model stage 0 (reads inputs), worker 1 the
// last one (reads labels); with one worker it holds both.
TEST_F(StageDataTest, InterleavedWorkersReadTheEndsTheyHold) {
  const Reference want = Train(spec_);
  {
    Pipeline p = BuildInterleaved(spec_, 2, 2, {2, 4, 5}, true, OnlyItsPart());
    ASSERT_EQ(p.stages.size(), 2u);
    ExpectEqualsReference(p, spec_, want);
  }
  {
    Pipeline p = BuildInterleaved(spec_, 1, 2, {3}, true, OnlyItsPart());
    ASSERT_EQ(p.stages.size(), 1u);
    ExpectEqualsReference(p, spec_, want);
  }
}

// A cross-step schedule: the split changes nothing, bit for bit, against
// the same schedule on the synthetic source (read whole by either end).
TEST_F(StageDataTest, CrossStepScheduleIsUnchangedBitForBit) {
  // 2BW takes no gradient clipping.
  spec_.mutable_optimizer()->set_clip_grad_norm(0);
  synthetic_.mutable_optimizer()->set_clip_grad_norm(0);
  Pipeline split =
      BuildPipeline(spec_, {2, 5}, v1::SCHEDULE_2BW, false, {}, OnlyItsPart());
  Pipeline whole = BuildPipeline(synthetic_, {2, 5}, v1::SCHEDULE_2BW);
  ASSERT_EQ(split.stages.size(), 3u);
  ASSERT_EQ(whole.stages.size(), 3u);
  ASSERT_TRUE(TrainAll(split, spec_.steps()).ok());
  ASSERT_TRUE(TrainAll(whole, spec_.steps()).ok());
  EXPECT_EQ(WeightsByName(split), WeightsByName(whole));
  const v1::GetStatusResponse a = split.stages.back()->GetStatus(0);
  const v1::GetStatusResponse b = whole.stages.back()->GetStatus(0);
  ASSERT_EQ(a.results_size(), spec_.steps());
  ASSERT_EQ(b.results_size(), spec_.steps());
  for (int i = 0; i < spec_.steps(); ++i) {
    EXPECT_EQ(a.results(i).loss(), b.results(i).loss()) << i;
  }
}

// A middle stage checks and opens no data file (every one it is given is
// missing); stage 0 and the last stage check exactly their part's files,
// with errors naming the file.
TEST_F(StageDataTest, AMiddleStageOpensNoDataFile) {
  const std::string absent = Path("absent.npy");
  v1::StageConfig config;
  config.set_job_id("job");
  *config.mutable_spec() = spec_;
  v1::NumpySource* n = config.mutable_spec()->mutable_data()->mutable_numpy();
  n->set_train_features(absent);
  n->set_train_labels(absent);
  n->set_eval_features(absent);
  n->set_eval_labels(absent);
  config.set_num_stages(3);
  config.set_stage(1);
  config.set_layer_begin(2);
  config.set_layer_end(5);
  config.set_downstream("in-memory");
  EXPECT_TRUE(ValidateStageConfig(config).ok()) << ValidateStageConfig(config);
  auto backend = CreateCpuBackend(1);
  auto middle = StageExecutor::Create(config, backend.get());
  ASSERT_TRUE(middle.ok()) << middle.status();

  // The same files fail the ends, each naming its own file.
  config.set_stage(0);
  config.set_layer_begin(0);
  config.set_layer_end(2);
  n->set_train_labels(Path("train-labels.npy"));  // not what stage 0 reads
  n->set_eval_labels(Path("eval-labels.npy"));
  absl::Status status = ValidateStageConfig(config);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("absent.npy"));
  status = StageExecutor::Create(config, backend.get()).status();
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("data.numpy.train_features"));

  config.set_stage(2);
  config.set_layer_begin(5);
  config.set_layer_end(7);
  config.clear_downstream();
  n->set_train_features(Path("train-features.npy"));  // not the last's
  n->set_eval_features(Path("eval-features.npy"));
  n->set_train_labels(absent);
  n->set_eval_labels(absent);
  status = ValidateStageConfig(config);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("absent.npy"));
  status = StageExecutor::Create(config, backend.get()).status();
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("data.numpy.train_labels"));
}

// Stage 0 orders 1024 samples, a last stage with 1023 labels would order
// others: the first micro-batch it scores fails, naming both files.
TEST_F(StageDataTest, SplitsOfOtherSizesFailNamingBothFiles) {
  const std::string short_train = Path("short-train-labels.npy");
  Pipeline p = BuildPipeline(spec_, {3}, v1::SCHEDULE_GPIPE, false, {},
                             [short_train](v1::StageConfig* config) {
                               if (config->stage() == 1) {
                                 config->mutable_spec()
                                     ->mutable_data()
                                     ->mutable_numpy()
                                     ->set_train_labels(short_train);
                               }
                             });
  ASSERT_EQ(p.stages.size(), 2u);
  for (auto& stage : p.stages) ASSERT_TRUE(stage->Train(1).ok());
  const absl::Status status = p.stages[1]->Wait();
  p.stages[0]->Stop();  // it waits for gradients that will not come
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("stage 0 reads 1024 samples from "
                        "data.numpy.train_features"));
  EXPECT_THAT(std::string(status.message()), HasSubstr(short_train));
  EXPECT_THAT(std::string(status.message()), HasSubstr("holds 1023"));

  // The held-out split alike, in an evaluation pass.
  const std::string short_eval = Path("short-eval-labels.npy");
  Pipeline q = BuildPipeline(spec_, {3}, v1::SCHEDULE_GPIPE, false, {},
                             [short_eval](v1::StageConfig* config) {
                               if (config->stage() == 1) {
                                 config->mutable_spec()
                                     ->mutable_data()
                                     ->mutable_numpy()
                                     ->set_eval_labels(short_eval);
                               }
                             });
  ASSERT_EQ(q.stages.size(), 2u);
  const std::vector<absl::StatusOr<v1::EvalResult>> results = EvaluateAll(q, 0);
  EXPECT_TRUE(results[0].ok()) << results[0].status();
  ASSERT_FALSE(results[1].ok());
  EXPECT_THAT(std::string(results[1].status().message()),
              HasSubstr("data.numpy.eval_features"));
  EXPECT_THAT(std::string(results[1].status().message()),
              HasSubstr(short_eval));
}

}  // namespace
}  // namespace pipetrain
