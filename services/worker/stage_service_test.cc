// The stage service on gRPC's in-process channel: GetTrace answers with the
// current stage's pipeline trace, filtered by step, and the usual errors
// without a stage or for another job; host errors reach the caller with
// their status codes; snapshots stream out in bounded chunks and restore a
// fresh stage, and malformed restore streams are refused without harm.
#include "services/worker/stage_service.h"

#include <chrono>
#include <functional>
#include <thread>

#include "common/proto_json.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "services/worker/stage_streams.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/pipeline/local_trainer.h"

namespace pipetrain {
namespace {

v1::StageConfig OneStageConfig(v1::ScheduleKindProto schedule) {
  v1::StageConfig config;
  const absl::Status status = ParseJson(R"({
    "jobId": "job",
    "spec": {
      "model": {
        "inputKind": "INPUT_KIND_FLOAT", "inputShape": [6],
        "loss": "LOSS_KIND_SOFTMAX_CROSS_ENTROPY",
        "layers": [
          {"linear": {"inFeatures": 6, "outFeatures": 8}},
          {"relu": {}},
          {"linear": {"inFeatures": 8, "outFeatures": 3}}
        ]},
      "data": {"synthetic": {"features": 6, "classes": 3,
                             "trainSamples": 256, "evalSamples": 16}},
      "optimizer": {"sgd": {"lr": 0.1}},
      "batchSize": 16, "microBatches": 4, "steps": 3, "seed": 3},
    "stage": 0, "numStages": 1, "layerBegin": 0, "layerEnd": 3})",
                                        &config);
  EXPECT_TRUE(status.ok()) << status;
  config.set_schedule(schedule);
  return config;
}

class StageServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    host_ = std::make_unique<StageHost>(CreateCpuBackend(1), nullptr);
    service_ = std::make_unique<StageServiceImpl>(
        host_.get(), [this](grpc::CallbackServerContext* context, bool probe) {
          return new UpstreamStream(host_.get(), size_t{1} << 20,
                                    context->peer(), probe, context);
        });
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::StageService::NewStub(
        server_->InProcessChannel(grpc::ChannelArguments()));
  }
  void TearDown() override {
    host_->Shutdown();
    server_->Shutdown();
  }

  template <typename Call>
  grpc::Status Unary(Call call) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(30));
    return call(&context);
  }

  grpc::Status GetTrace(const std::string& job, int64_t since,
                        v1::GetTraceResponse* response) {
    v1::GetTraceRequest request;
    request.set_job_id(job);
    request.set_since_step(since);
    return Unary([&](grpc::ClientContext* c) {
      return stub_->GetTrace(c, request, response);
    });
  }

  // Configures `config`, trains it to the end and waits until it is done.
  void TrainToTheEnd(const v1::StageConfig& config) {
    const grpc::Status status = Configure(config);
    ASSERT_TRUE(status.ok()) << status.error_message();
    TrainConfigured(config);
  }

  // Trains the configured stage of `config` to the end and waits.
  void TrainConfigured(const v1::StageConfig& config) {
    grpc::Status status;
    v1::TrainRequest train;
    train.set_job_id(config.job_id());
    train.set_until_step(config.spec().steps());
    v1::TrainResponse trained;
    status = Unary([&](grpc::ClientContext* c) {
      return stub_->Train(c, train, &trained);
    });
    ASSERT_TRUE(status.ok()) << status.error_message();
    for (int i = 0; i < 3000; ++i) {
      v1::GetStatusRequest request;
      request.set_job_id(config.job_id());
      v1::GetStatusResponse response;
      status = Unary([&](grpc::ClientContext* c) {
        return stub_->GetStatus(c, request, &response);
      });
      ASSERT_TRUE(status.ok()) << status.error_message();
      ASSERT_NE(response.state(), v1::STAGE_STATE_FAILED) << response.error();
      if (response.state() == v1::STAGE_STATE_DONE) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL() << "the stage did not finish";
  }

  grpc::Status Configure(const v1::StageConfig& config) {
    v1::ConfigureRequest request;
    *request.mutable_config() = config;
    v1::ConfigureResponse response;
    return Unary([&](grpc::ClientContext* c) {
      return stub_->Configure(c, request, &response);
    });
  }

  // Every chunk of the snapshot of `step`.
  grpc::Status Fetch(const std::string& job, int64_t step,
                     std::vector<v1::StateChunk>* chunks) {
    v1::FetchSnapshotRequest request;
    request.set_job_id(job);
    request.set_step(step);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(30));
    auto reader = stub_->FetchSnapshot(&context, request);
    v1::StateChunk chunk;
    while (reader->Read(&chunk)) chunks->push_back(chunk);
    return reader->Finish();
  }

  grpc::Status Restore(const std::vector<v1::StateChunk>& chunks,
                       v1::RestoreStateResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(30));
    auto writer = stub_->RestoreState(&context, response);
    for (const v1::StateChunk& chunk : chunks) {
      if (!writer->Write(chunk)) break;  // the server ended the call
    }
    writer->WritesDone();
    return writer->Finish();
  }

  std::unique_ptr<StageHost> host_;
  std::unique_ptr<StageServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::StageService::Stub> stub_;
};

TEST_F(StageServiceTest, GetTraceNeedsAStageOfThatJob) {
  v1::GetTraceResponse response;
  EXPECT_EQ(GetTrace("job", 0, &response).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  TrainToTheEnd(OneStageConfig(v1::SCHEDULE_GPIPE));
  EXPECT_EQ(GetTrace("other", 0, &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(StageServiceTest, GetTraceReturnsTheStepsSinceAsked) {
  const v1::StageConfig config = OneStageConfig(v1::SCHEDULE_ZB_H1);
  TrainToTheEnd(config);
  // One stage, M = 4, ZB-H1: per micro-batch Load, F, Loss, BI, W; + Step.
  constexpr int kPerStep = 4 * 5 + 1;
  v1::GetTraceResponse all;
  ASSERT_TRUE(GetTrace("job", 0, &all).ok());
  ASSERT_EQ(all.events_size(), 3 * kPerStep);
  int weight_passes = 0;
  for (const v1::TraceEvent& e : all.events()) {
    EXPECT_EQ(e.stage(), 0);
    EXPECT_LE(e.start_unix_us(), e.end_unix_us());
    weight_passes += e.op() == "W";
  }
  EXPECT_EQ(weight_passes, 3 * 4);
  EXPECT_EQ(all.events(kPerStep - 1).op(), "Step");

  v1::GetTraceResponse last;
  ASSERT_TRUE(GetTrace("job", 2, &last).ok());
  ASSERT_EQ(last.events_size(), kPerStep);
  for (const v1::TraceEvent& e : last.events()) {
    EXPECT_EQ(e.step(), 2);
    EXPECT_EQ(e.weight_version(), 2);
  }
  v1::GetTraceResponse none;
  ASSERT_TRUE(GetTrace("job", 3, &none).ok());
  EXPECT_EQ(none.events_size(), 0);
}

// Evaluate reaches the host: its argument checks and job lookup come back
// as gRPC status codes.
TEST_F(StageServiceTest, EvaluateAnswersWithTheHostsStatus) {
  v1::EvaluateStageRequest request;
  request.set_job_id("job");
  v1::EvaluateStageResponse response;
  EXPECT_EQ(Unary([&](grpc::ClientContext* c) {
              return stub_->Evaluate(c, request, &response);
            }).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  request.set_max_samples(-1);
  EXPECT_EQ(Unary([&](grpc::ClientContext* c) {
              return stub_->Evaluate(c, request, &response);
            }).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// A one-stage job whose second linear layer's weight (512 x 600 floats)
// is larger than one chunk; AdamW, a snapshot every 2 steps.
v1::StageConfig WideStageConfig() {
  v1::StageConfig config = OneStageConfig(v1::SCHEDULE_GPIPE);
  v1::ModelSpec layers;
  const absl::Status status = ParseJson(R"({"layers": [
      {"linear": {"inFeatures": 6, "outFeatures": 512}}, {"relu": {}},
      {"linear": {"inFeatures": 512, "outFeatures": 600}}, {"relu": {}},
      {"linear": {"inFeatures": 600, "outFeatures": 3}}]})",
                                        &layers);
  EXPECT_TRUE(status.ok()) << status;
  *config.mutable_spec()->mutable_model()->mutable_layers() = layers.layers();
  config.set_layer_end(5);
  v1::OptimizerSpec* opt = config.mutable_spec()->mutable_optimizer();
  opt->clear_sgd();
  opt->mutable_adamw()->set_lr(0.01f);
  config.mutable_spec()->set_steps(2);
  config.mutable_spec()->set_checkpoint_every(2);
  return config;
}

TEST_F(StageServiceTest, SnapshotsStreamInChunksAndRestoreAFreshStage) {
  const v1::StageConfig config = WideStageConfig();
  TrainToTheEnd(config);
  std::vector<v1::StateChunk> chunks;
  EXPECT_EQ(Fetch("job", 1, &chunks).error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(chunks.empty());
  const grpc::Status fetched = Fetch("job", 2, &chunks);
  ASSERT_TRUE(fetched.ok()) << fetched.error_message();
  int pieces_of_the_wide_weight = 0;
  std::string last_name;
  int64_t next_offset = 0;
  for (const v1::StateChunk& c : chunks) {
    EXPECT_LE(c.data().size(), size_t{1} << 20);
    EXPECT_EQ(c.step(), 2);
    EXPECT_EQ(c.weight_version(), 2);
    EXPECT_EQ(c.optimizer_steps(), 2);
    if (c.name() != last_name) next_offset = 0;
    EXPECT_EQ(c.offset(), next_offset) << c.name();
    next_offset += static_cast<int64_t>(c.data().size());
    last_name = c.name();
    if (c.name() == "layers.2.weight") {
      ++pieces_of_the_wide_weight;
      EXPECT_THAT(c.shape(), ::testing::ElementsAre(600, 512));
    }
  }
  EXPECT_EQ(pieces_of_the_wide_weight, 2);
  // A passed boundary cannot be asked for any more.
  v1::SnapshotRequest ask;
  ask.set_job_id("job");
  ask.set_step(1);
  v1::SnapshotResponse asked;
  const grpc::Status passed = Unary(
      [&](grpc::ClientContext* c) { return stub_->Snapshot(c, ask, &asked); });
  EXPECT_EQ(passed.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(passed.error_message(), ::testing::HasSubstr("next step"));

  // A fresh stage from step 2 trains on to 4 as if never interrupted.
  v1::StageConfig resumed = config;
  resumed.set_start_step(2);
  resumed.set_restore_expected(true);
  resumed.mutable_spec()->set_steps(4);
  ASSERT_TRUE(Configure(resumed).ok());
  v1::RestoreStateResponse restored;
  const grpc::Status status = Restore(chunks, &restored);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(restored.tensors(), 3 * 6);  // 6 parameters, m and v each
  TrainConfigured(resumed);
  auto backend = CreateCpuBackend(1);
  auto reference = LocalTrainer::Create(resumed.spec(), backend.get());
  ASSERT_TRUE(reference.ok()) << reference.status();
  for (int i = 0; i < 4; ++i) ASSERT_TRUE((*reference)->Step().ok());
  auto want = (*reference)->model()->ParamsToHost();
  ASSERT_TRUE(want.ok());
  v1::GetWeightsRequest request;
  request.set_job_id("job");
  v1::GetWeightsResponse got;
  ASSERT_TRUE(Unary([&](grpc::ClientContext* c) {
                return stub_->GetWeights(c, request, &got);
              }).ok());
  ASSERT_EQ(got.weights_size(), static_cast<int>(want->size()));
  for (int p = 0; p < got.weights_size(); ++p) {
    const std::vector<float> w = (*want)[p].ToVector();
    const float* g =
        reinterpret_cast<const float*>(got.weights(p).data().data());
    for (size_t i = 0; i < w.size(); ++i) {
      ASSERT_NEAR(g[i], w[i], 1e-5) << got.weights(p).name() << "[" << i << "]";
    }
  }
}

TEST_F(StageServiceTest, MalformedRestoreStreamsAreRefusedHarmlessly) {
  const v1::StageConfig config = WideStageConfig();
  TrainToTheEnd(config);
  std::vector<v1::StateChunk> good;
  ASSERT_TRUE(Fetch("job", 2, &good).ok());
  v1::StageConfig resumed = config;
  resumed.set_start_step(2);
  resumed.set_restore_expected(true);
  resumed.mutable_spec()->set_steps(3);
  ASSERT_TRUE(Configure(resumed).ok());
  v1::TrainRequest train;
  train.set_job_id("job");
  train.set_until_step(3);
  v1::TrainResponse trained;
  EXPECT_EQ(Unary([&](grpc::ClientContext* c) {
              return stub_->Train(c, train, &trained);
            }).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);

  size_t wide = 0;
  while (good[wide].name() != "layers.2.weight") ++wide;
  struct Case {
    const char* what;
    std::function<void(std::vector<v1::StateChunk>*)> edit;
  };
  const std::vector<Case> cases = {
      {"offsets do not add up",
       [wide](auto* c) { (*c)[wide + 1].set_offset(8); }},
      {"a size past the tensor",
       [wide](auto* c) {
         for (size_t i = wide; i < wide + 2; ++i) {
           (*c)[i].set_total_bytes(int64_t{1} << 40);
         }
       }},
      {"a wrong dtype",
       [wide](auto* c) { (*c)[wide].set_dtype(v1::DTYPE_BF16); }},
      {"a wrong shape",
       [wide](auto* c) {
         (*c)[wide].set_shape(0, 512);
         (*c)[wide].set_shape(1, 600);
       }},
      {"cut mid-tensor", [wide](auto* c) { c->resize(wide + 1); }},
      {"a parameter missing",
       [wide](auto* c) { c->erase(c->begin() + wide, c->begin() + wide + 2); }},
      {"no chunk at all", [](auto* c) { c->clear(); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<v1::StateChunk> chunks = good;
    c.edit(&chunks);
    v1::RestoreStateResponse response;
    const grpc::Status status = Restore(chunks, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << status.error_message();
  }
  v1::RestoreStateResponse response;
  const grpc::Status status = Restore(good, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  TrainConfigured(resumed);
}

}  // namespace
}  // namespace pipetrain
