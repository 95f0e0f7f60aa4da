// The stage service on gRPC's in-process channel: GetTrace answers with the
// current stage's pipeline trace, filtered by step, and the usual errors
// without a stage or for another job; host errors reach the caller with
// their status codes.
#include "services/worker/stage_service.h"

#include <chrono>
#include <thread>

#include "common/proto_json.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "services/worker/stage_streams.h"
#include "worker/compute/cpu/cpu_backend.h"

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
    service_ = std::make_unique<StageServiceImpl>(host_.get(), [this] {
      return new UpstreamStream(host_.get(), size_t{1} << 20);
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
    v1::ConfigureRequest configure;
    *configure.mutable_config() = config;
    v1::ConfigureResponse configured;
    grpc::Status status = Unary([&](grpc::ClientContext* c) {
      return stub_->Configure(c, configure, &configured);
    });
    ASSERT_TRUE(status.ok()) << status.error_message();
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

}  // namespace
}  // namespace pipetrain
