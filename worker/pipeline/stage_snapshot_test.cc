// Checkpoints on stage executors connected in memory: snapshots taken at
// step boundaries while training, restored into a fresh pipeline cut
// elsewhere, train on to the same weights as an uninterrupted in-process
// run; requests for passed steps, training before a restore and malformed
// state are refused and leave the stage usable.
#include "worker/pipeline/stage_snapshot.h"

#include <cmath>
#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/pipeline/in_memory_pipeline.h"
#include "worker/pipeline/local_trainer.h"

namespace pipetrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::TrainingSpec Spec(bool adam, int64_t steps, int64_t every) {
  v1::TrainingSpec spec = SmallMlpSpec(4, false);
  if (adam) {
    spec.mutable_optimizer()->mutable_adamw()->set_lr(0.01f);
    spec.mutable_optimizer()->mutable_adamw()->set_weight_decay(0.01f);
  }
  spec.set_steps(steps);
  spec.set_checkpoint_every(every);
  return spec;
}

// Weights by name after `steps` steps of the in-process trainer.
std::map<std::string, std::vector<float>> Reference(
    const v1::TrainingSpec& spec) {
  std::map<std::string, std::vector<float>> out;
  auto backend = CreateCpuBackend(1);
  auto trainer = LocalTrainer::Create(spec, backend.get());
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return out;
  for (int64_t i = 0; i < spec.steps(); ++i) {
    EXPECT_TRUE((*trainer)->Step().ok());
  }
  auto weights = (*trainer)->model()->ParamsToHost();
  EXPECT_TRUE(weights.ok());
  if (!weights.ok()) return out;
  for (size_t i = 0; i < weights->size(); ++i) {
    out[(*trainer)->model()->params()[i]->name] = (*weights)[i].ToVector();
  }
  return out;
}

void ExpectNear(const std::map<std::string, std::vector<float>>& got,
                const std::map<std::string, std::vector<float>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, values] : want) {
    ASSERT_EQ(got.count(name), 1u) << name;
    const std::vector<float>& g = got.at(name);
    ASSERT_EQ(g.size(), values.size()) << name;
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_NEAR(g[i], values[i], 1e-5) << name << "[" << i << "]";
    }
  }
}

// Every stage's snapshot of `step`, merged into one state.
TrainingState FetchAll(Pipeline& p, int64_t step, int64_t want_version) {
  TrainingState out;
  for (auto& stage : p.stages) {
    auto snapshot = stage->FetchSnapshot(step);
    EXPECT_TRUE(snapshot.ok()) << snapshot.status();
    if (!snapshot.ok()) continue;
    EXPECT_EQ((*snapshot)->step, step);
    EXPECT_EQ((*snapshot)->weight_version, want_version);
    TrainingState copy = (*snapshot)->state;
    out.tensors.merge(copy.tensors);
    out.optimizer_steps = (*snapshot)->state.optimizer_steps;
  }
  return out;
}

ConfigEdit Resume(int64_t step) {
  return [step](v1::StageConfig* c) {
    c->set_start_step(step);
    c->set_restore_expected(true);
  };
}

absl::Status RestoreAll(Pipeline& p, const TrainingState& state) {
  for (auto& stage : p.stages) {
    absl::Status status = stage->RestoreState(state);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

// Train 6 steps with a snapshot every 2; resume from step 4 on three
// stages cut elsewhere: the weights equal an uninterrupted run's.
TEST(StageSnapshot, ResumedUnderAnotherCutEqualsTheUninterruptedRun) {
  for (auto schedule :
       {v1::SCHEDULE_GPIPE, v1::SCHEDULE_1F1B_FLUSH, v1::SCHEDULE_ZB_H1}) {
    for (bool adam : {false, true}) {
      SCOPED_TRACE(::testing::Message() << schedule << " adam=" << adam);
      const v1::TrainingSpec spec = Spec(adam, 6, 2);
      Pipeline first = BuildPipeline(spec, {3}, schedule);
      ASSERT_TRUE(TrainAll(first, 6).ok());
      for (auto& stage : first.stages) {
        // Boundaries 2 and 4 while training, 6 where the run ended.
        EXPECT_THAT(stage->FetchSnapshot(2).status().code(),
                    absl::StatusCode::kNotFound);
        auto six = stage->FetchSnapshot(6);
        ASSERT_TRUE(six.ok()) << six.status();
        EXPECT_EQ((*six)->weight_version, 6);
      }
      const TrainingState saved = FetchAll(first, 4, 4);
      EXPECT_EQ(saved.optimizer_steps, 4);

      Pipeline resumed =
          BuildPipeline(spec, {1, 5}, schedule, false, {}, Resume(4));
      ASSERT_TRUE(RestoreAll(resumed, saved).ok());
      ASSERT_TRUE(TrainAll(resumed, 6).ok());
      EXPECT_EQ(resumed.stages[0]->GetStatus(0).weight_version(), 6);
      ExpectNear(WeightsByName(resumed), Reference(spec));
    }
  }
}

// Interleaved stages (two chunks each) snapshot and resume too, under
// another cut into chunks.
TEST(StageSnapshot, InterleavedStagesResume) {
  const v1::TrainingSpec spec = Spec(true, 5, 3);
  Pipeline first = BuildInterleaved(spec, 2, 2, {2, 4, 5});
  ASSERT_TRUE(TrainAll(first, 5).ok());
  const TrainingState saved = FetchAll(first, 3, 3);
  Pipeline resumed = BuildInterleaved(spec, 2, 2, {1, 3, 6}, true, Resume(3));
  ASSERT_TRUE(RestoreAll(resumed, saved).ok());
  ASSERT_TRUE(TrainAll(resumed, 5).ok());
  ExpectNear(WeightsByName(resumed), Reference(spec));
}

// The asynchronous schedules snapshot their live weights and optimizer
// state (not the stashes) and resume from them with empty stashes.
TEST(StageSnapshot, AsynchronousSchedulesSnapshotAndResume) {
  for (auto schedule : {v1::SCHEDULE_ASYNC_1F1B, v1::SCHEDULE_2BW}) {
    SCOPED_TRACE(schedule);
    v1::TrainingSpec spec = Spec(false, 6, 3);
    spec.mutable_optimizer()->set_clip_grad_norm(0);  // not with async
    Pipeline first = BuildPipeline(spec, {3}, schedule);
    ASSERT_TRUE(TrainAll(first, 6).ok());
    TrainingState saved;
    for (auto& stage : first.stages) {
      auto snapshot = stage->FetchSnapshot(3);
      ASSERT_TRUE(snapshot.ok()) << snapshot.status();
      TrainingState copy = (*snapshot)->state;
      saved.tensors.merge(copy.tensors);
      saved.optimizer_steps = copy.optimizer_steps;
    }
    Pipeline resumed = BuildPipeline(spec, {3}, schedule, false, {}, Resume(3));
    ASSERT_TRUE(RestoreAll(resumed, saved).ok());
    // Restored exactly (the layer's [in, out] weights against the
    // checkpoint's [out, in] are compared through a fresh snapshot).
    for (auto& stage : resumed.stages) {
      ASSERT_TRUE(stage->Snapshot(3).ok());
      auto again = stage->FetchSnapshot(3);
      ASSERT_TRUE(again.ok()) << again.status();
      for (const auto& [name, tensor] : (*again)->state.tensors) {
        EXPECT_EQ(tensor.ToVector(), saved.tensors.at(name).ToVector()) << name;
      }
    }
    ASSERT_TRUE(TrainAll(resumed, 6).ok());
    const int64_t per_step = schedule == v1::SCHEDULE_ASYNC_1F1B ? 4 : 1;
    EXPECT_EQ(resumed.stages[0]->GetStatus(0).weight_version(), 6 * per_step);
    for (const auto& [name, values] : WeightsByName(resumed)) {
      for (float v : values) ASSERT_TRUE(std::isfinite(v)) << name;
    }
  }
}

// On request: an idle stage at the boundary takes it at once, a later one
// when training gets there; a passed one is refused with the next step.
TEST(StageSnapshot, RequestsAtAndAfterTheCurrentBoundary) {
  const v1::TrainingSpec spec = Spec(false, 6, 0);
  Pipeline p = BuildPipeline(spec, {3});
  ASSERT_TRUE(TrainAll(p, 2).ok());
  StageExecutor& stage = *p.stages[1];
  EXPECT_EQ(stage.FetchSnapshot(2).status().code(),
            absl::StatusCode::kNotFound);
  auto at = stage.Snapshot(2);
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(*at, 2);
  ASSERT_TRUE(stage.FetchSnapshot(2).ok());
  const absl::Status passed = stage.Snapshot(1).status();
  EXPECT_EQ(passed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(passed.message(), HasSubstr("next step it can snapshot is 2"));
  for (auto& s : p.stages) ASSERT_TRUE(s->Snapshot(4).ok());
  EXPECT_EQ(stage.FetchSnapshot(4).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(TrainAll(p, 6).ok());
  auto four = stage.FetchSnapshot(4);
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_EQ((*four)->weight_version, 4);
  // checkpoint_every 0: nothing but what was asked for.
  EXPECT_EQ(stage.FetchSnapshot(6).status().code(),
            absl::StatusCode::kNotFound);
  const absl::Status late = stage.Snapshot(5).status();
  EXPECT_THAT(late.message(), HasSubstr("next step it can snapshot is 6"));
}

// A stage that expects its state refuses to train or evaluate until it
// has it; a malformed state is refused and a good one still loads; a stage
// that expects none refuses a restore.
TEST(StageSnapshot, RestoreGatesTrainingAndRefusesMalformedState) {
  const v1::TrainingSpec spec = Spec(true, 4, 2);
  Pipeline first = BuildPipeline(spec, {});
  ASSERT_TRUE(TrainAll(first, 2).ok());
  const TrainingState saved = FetchAll(first, 2, 2);
  EXPECT_EQ(first.stages[0]->RestoreState(saved).code(),
            absl::StatusCode::kFailedPrecondition);

  Pipeline p =
      BuildPipeline(spec, {}, v1::SCHEDULE_GPIPE, false, {}, Resume(2));
  StageExecutor& stage = *p.stages[0];
  const absl::Status early = stage.Train(4).status();
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(early.message(), HasSubstr("RestoreState"));
  EXPECT_EQ(stage.Evaluate(0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  TrainingState bad = saved;
  bad.tensors.erase("layers.4.bias");
  const absl::Status refused = stage.RestoreState(bad);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("layers.4.bias"));
  EXPECT_EQ(stage.Train(4).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(stage.RestoreState(saved).ok());
  ASSERT_TRUE(TrainAll(p, 4).ok());
  ExpectNear(WeightsByName(p), Reference(spec));
  // Restoring is for a stage that has not trained.
  EXPECT_EQ(stage.RestoreState(saved).code(),
            absl::StatusCode::kFailedPrecondition);
}

// A snapshot asked for while the pipeline trains is taken at exactly that
// boundary: its weights are the in-process run's after that many steps.
TEST(StageSnapshot, RequestedWhileTrainingIsTakenAtThatBoundary) {
  const v1::TrainingSpec spec = Spec(false, 30, 0);
  Pipeline p = BuildPipeline(spec, {3}, v1::SCHEDULE_1F1B_FLUSH);
  for (auto& stage : p.stages) ASSERT_TRUE(stage->Train(30).ok());
  int64_t asked = -1;
  while (asked < 0 && p.stages[0]->next_step() < 25) {
    const int64_t step = p.stages[0]->next_step() + 2;
    bool all = true;
    for (auto& stage : p.stages) {
      const absl::StatusOr<int64_t> at = stage->Snapshot(step);
      // A stage may already be past it (then ask for a later one).
      if (!at.ok()) {
        EXPECT_EQ(at.status().code(), absl::StatusCode::kFailedPrecondition);
        all = false;
      }
    }
    if (all) asked = step;
  }
  ASSERT_GE(asked, 2);
  for (auto& stage : p.stages) ASSERT_TRUE(stage->Wait().ok());
  const TrainingState got = FetchAll(p, asked, asked);

  v1::TrainingSpec prefix = spec;
  prefix.set_steps(asked);
  auto backend = CreateCpuBackend(1);
  auto trainer = LocalTrainer::Create(prefix, backend.get());
  ASSERT_TRUE(trainer.ok());
  for (int64_t i = 0; i < asked; ++i) ASSERT_TRUE((*trainer)->Step().ok());
  auto optimizer = Optimizer::Create(spec.optimizer(), backend.get());
  ASSERT_TRUE(optimizer.ok());
  auto want =
      ExportTrainingState({(*trainer)->model()}, **optimizer, backend.get());
  ASSERT_TRUE(want.ok());
  int params = 0;
  for (const auto& [name, tensor] : want->tensors) {
    if (name.rfind("layers.", 0) != 0) continue;  // the parameters only
    ++params;
    const std::vector<float> w = tensor.ToVector();
    const std::vector<float> g = got.tensors.at(name).ToVector();
    ASSERT_EQ(g.size(), w.size()) << name;
    for (size_t i = 0; i < w.size(); ++i) {
      ASSERT_NEAR(g[i], w[i], 1e-5) << name << "[" << i << "]";
    }
  }
  EXPECT_EQ(params, 8);
  EXPECT_EQ(got.optimizer_steps, asked);
}

// A stage without parameters (gelu, dropout) has an empty state: its
// snapshot holds no tensor and an empty state restores it.
TEST(StageSnapshot, AStageWithoutParametersHasAnEmptyState) {
  const v1::TrainingSpec spec = Spec(false, 4, 2);
  Pipeline p =
      BuildPipeline(spec, {1, 3}, v1::SCHEDULE_GPIPE, false, {}, Resume(2));
  EXPECT_EQ(p.stages[0]->RestoreState(TrainingState()).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(p.stages[1]->RestoreState(TrainingState()).ok());
  EXPECT_TRUE(p.stages[1]->state_layout().tensors().empty());
  ASSERT_TRUE(p.stages[1]->Snapshot(2).ok());
  auto snapshot = p.stages[1]->FetchSnapshot(2);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_TRUE((*snapshot)->state.tensors.empty());
}

TEST(StageSnapshots, WhichBoundariesAreTakenAndKept) {
  StageSnapshots snapshots(/*every=*/2, /*start_step=*/2);
  int captures = 0;
  auto capture = [&captures](int64_t step) {
    return [&captures, step]() -> absl::StatusOr<StageStateSnapshot> {
      ++captures;
      StageStateSnapshot s;
      s.step = step;
      return s;
    };
  };
  // The start step is what the stage was given: not taken by itself.
  ASSERT_TRUE(snapshots.AtBoundary(2, true, capture(2)).ok());
  ASSERT_TRUE(snapshots.AtBoundary(3, true, capture(3)).ok());
  EXPECT_EQ(captures, 0);
  ASSERT_TRUE(snapshots.Request(5).ok());
  for (int64_t step : {4, 5, 6}) {
    ASSERT_TRUE(snapshots.AtBoundary(step, true, capture(step)).ok());
  }
  EXPECT_EQ(captures, 3);
  EXPECT_THAT(snapshots.HeldSteps(), ElementsAre(5, 6));
  // Held, or being at the boundary again, takes nothing more.
  ASSERT_TRUE(snapshots.AtBoundary(6, false, capture(6)).ok());
  EXPECT_EQ(captures, 3);
  EXPECT_EQ(*snapshots.Request(6), 6);
  EXPECT_EQ(snapshots.Request(4).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(snapshots.Request(-1).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A failed copy is reported and keeps nothing.
  ASSERT_TRUE(snapshots.Request(9).ok());
  const absl::Status failed = snapshots.AtBoundary(9, true, [] {
    return absl::StatusOr<StageStateSnapshot>(
        absl::ResourceExhaustedError("out of host memory"));
  });
  EXPECT_EQ(failed.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(snapshots.Find(9).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace pipetrain
