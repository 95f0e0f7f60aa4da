// Checkpoints across worker processes: two stage workers train a job with a
// snapshot every k steps; the snapshot of step k is fetched from both over
// gRPC and restored into two fresh workers whose stages cut the model
// elsewhere; they train on to step N and end with the weights of an
// uninterrupted in-process run. Malformed restore streams are refused with
// INVALID_ARGUMENT and the stage still takes a good one.
#include <chrono>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/proto_json.h"
#include "gtest/gtest.h"
#include "services/rpc/grpc_util.h"
#include "spec/test_model_specs.h"
#include "tests/cluster_harness.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/pipeline/local_trainer.h"

namespace pipetrain::testing {
namespace {

constexpr int64_t kSteps = 6;       // N
constexpr int64_t kCheckpoint = 3;  // k

v1::TrainingSpec Spec(bool adam) {
  v1::TrainingSpec spec;
  const absl::Status status = ParseJson(test_specs::kSmallMlpTraining, &spec);
  EXPECT_TRUE(status.ok()) << status;
  spec.set_micro_batches(4);
  if (adam) {
    spec.mutable_optimizer()->mutable_adamw()->set_lr(0.01f);
    spec.mutable_optimizer()->mutable_adamw()->set_weight_decay(0.01f);
  }
  spec.set_steps(kSteps);
  spec.set_checkpoint_every(kCheckpoint);
  return spec;
}

// Per-step losses and final weights (model order) of the in-process run.
PipelineRun Reference(const v1::TrainingSpec& spec) {
  PipelineRun out;
  auto backend = CreateCpuBackend(1);
  auto trainer = LocalTrainer::Create(spec, backend.get());
  out.status = trainer.status();
  if (!out.status.ok()) return out;
  for (int64_t i = 0; i < spec.steps(); ++i) {
    auto r = (*trainer)->Step();
    out.status = r.status();
    if (!out.status.ok()) return out;
    out.losses.push_back(r->loss);
  }
  auto weights = (*trainer)->model()->ParamsToHost();
  out.status = weights.status();
  if (!out.status.ok()) return out;
  for (const Tensor& t : *weights) out.weights.push_back(t.ToVector());
  return out;
}

absl::Status FetchSnapshot(Worker& worker, const std::string& job, int64_t step,
                           std::vector<v1::StateChunk>* out) {
  v1::FetchSnapshotRequest request;
  request.set_job_id(job);
  request.set_step(step);
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(30));
  auto reader = worker.stub->FetchSnapshot(&context, request);
  v1::StateChunk chunk;
  while (reader->Read(&chunk)) out->push_back(chunk);
  return FromGrpcStatus(reader->Finish());
}

absl::Status RestoreState(Worker& worker,
                          const std::vector<v1::StateChunk>& chunks) {
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(30));
  v1::RestoreStateResponse response;
  auto writer = worker.stub->RestoreState(&context, &response);
  for (const v1::StateChunk& chunk : chunks) {
    if (!writer->Write(chunk)) break;  // the stage ended the call
  }
  writer->WritesDone();
  return FromGrpcStatus(writer->Finish());
}

class CheckpointTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    for (std::vector<Worker>* pair : {&first_, &fresh_}) {
      for (int i = 0; i < 2; ++i) {
        auto w = StartWorker();
        ASSERT_TRUE(w.ok()) << w.status();
        pair->push_back(std::move(*w));
      }
    }
  }
  static void TearDownTestSuite() {
    first_.clear();
    fresh_.clear();
  }

  static std::vector<Worker> first_;
  static std::vector<Worker> fresh_;
};

std::vector<Worker> CheckpointTest::first_;
std::vector<Worker> CheckpointTest::fresh_;

TEST_F(CheckpointTest,
       ResumedOnFreshStagesUnderAnotherCutEqualsTheUninterruptedRun) {
  int job_number = 0;
  for (auto schedule : {v1::SCHEDULE_GPIPE, v1::SCHEDULE_1F1B_FLUSH}) {
    for (bool adam : {false, true}) {
      SCOPED_TRACE(::testing::Message() << schedule << " adam=" << adam);
      const v1::TrainingSpec spec = Spec(adam);
      const std::string job = absl::StrCat("ckpt-", ++job_number);
      PipelineOptions options;
      options.schedule = schedule;
      options.fetch_weights = false;
      const PipelineRun first = RunPipeline(first_, job, spec, {3}, options);
      ASSERT_TRUE(first.status.ok()) << first.status;

      // One full checkpoint: both stages' snapshots of step k.
      std::vector<v1::StateChunk> checkpoint;
      for (Worker& w : first_) {
        const absl::Status fetched =
            FetchSnapshot(w, job, kCheckpoint, &checkpoint);
        ASSERT_TRUE(fetched.ok()) << fetched;
      }
      std::set<std::string> names;
      for (const v1::StateChunk& c : checkpoint) {
        EXPECT_EQ(c.step(), kCheckpoint);
        EXPECT_EQ(c.weight_version(), kCheckpoint);
        EXPECT_EQ(c.optimizer_steps(), kCheckpoint);
        names.insert(c.name());
      }
      // 8 parameters (3 linear layers' weights and biases, the norm's gamma
      // and beta), each with its optimizer slots (1 for SGD, 2 for Adam).
      EXPECT_EQ(names.size(), 8u * (adam ? 3 : 2));
      EXPECT_EQ(names.count("layers.4.weight"), 1u);

      PipelineOptions resume = options;
      resume.fetch_weights = true;
      resume.start_step = kCheckpoint;
      resume.restore = [&](Worker& w, int stage) -> absl::Status {
        if (stage == 0) {
          // A stream whose offsets do not add up is refused, harmlessly.
          std::vector<v1::StateChunk> bad = checkpoint;
          bad[0].set_offset(bad[0].offset() + 4);
          const absl::Status refused = RestoreState(w, bad);
          EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument)
              << refused;
        }
        return RestoreState(w, checkpoint);
      };
      const PipelineRun resumed = RunPipeline(fresh_, job, spec, {5}, resume);
      ASSERT_TRUE(resumed.status.ok()) << resumed.status;

      const PipelineRun want = Reference(spec);
      ASSERT_TRUE(want.status.ok()) << want.status;
      // The resumed stages ran steps k .. N-1 only.
      ASSERT_EQ(resumed.losses.size(),
                static_cast<size_t>(kSteps - kCheckpoint));
      for (size_t i = 0; i < resumed.losses.size(); ++i) {
        EXPECT_NEAR(resumed.losses[i], want.losses[kCheckpoint + i],
                    1e-5 * want.losses[kCheckpoint + i])
            << "step " << kCheckpoint + i;
      }
      ASSERT_EQ(resumed.weights.size(), want.weights.size());
      for (size_t p = 0; p < want.weights.size(); ++p) {
        ASSERT_EQ(resumed.weights[p].size(), want.weights[p].size());
        for (size_t i = 0; i < want.weights[p].size(); ++i) {
          ASSERT_NEAR(resumed.weights[p][i], want.weights[p][i], 1e-5)
              << "parameter " << p << "[" << i << "]";
        }
      }
    }
  }
}

}  // namespace
}  // namespace pipetrain::testing
