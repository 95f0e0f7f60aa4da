// The client end of a stage stream while the next stage ends it: a sender
// keeps sending as the refusal comes back, so its writes race the call's
// end; every Send returns (Unavailable once the stream is ending), the
// executor's mailbox fails with the next stage's reason, and Close
// returns. Under AddressSanitizer a write started on a call gRPC has
// finished is caught here.
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/proto_json.h"
#include "gtest/gtest.h"
#include "services/rpc/grpc_server.h"
#include "services/worker/stage_service.h"
#include "services/worker/stage_streams.h"
#include "spec/test_model_specs.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/pipeline/stage_executor.h"

namespace pipetrain {
namespace {

// Stage 0 of 2 of the small MLP (test_specs::kSmallMlpTraining): its
// Linear 12 -> 32 sends [8, 32] activations downstream.
v1::StageConfig FirstOfTwo() {
  v1::StageConfig config;
  config.set_job_id("job");
  const absl::Status status =
      ParseJson(test_specs::kSmallMlpTraining, config.mutable_spec());
  EXPECT_TRUE(status.ok()) << status;
  config.mutable_spec()->set_micro_batches(4);
  config.set_num_stages(2);
  config.set_layer_end(1);
  config.set_downstream("next");
  return config;
}

TEST(DownstreamStreamTest, SendsThatRaceTheStreamsEndAllReturn) {
  // The next stage's worker runs no stage: it refuses the stream's HELLO.
  auto host = std::make_unique<StageHost>(CreateCpuBackend(1), nullptr);
  StageServiceImpl service(
      host.get(), [&host](grpc::CallbackServerContext* context, bool probe) {
        return new UpstreamStream(host.get(), size_t{1} << 20, context->peer(),
                                  probe, context);
      });
  int port = 0;
  auto server = StartGrpcServer("127.0.0.1:0", &service, &port);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", port);

  auto backend = CreateCpuBackend(1);
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE(::testing::Message() << "round " << round);
    auto created = StageExecutor::Create(FirstOfTwo(), backend.get());
    ASSERT_TRUE(created.ok()) << created.status();
    std::shared_ptr<StageExecutor> executor = std::move(*created);
    std::shared_ptr<DownstreamStream> stream =
        DownstreamStream::Open(address, executor, nullptr, size_t{1} << 20);
    absl::Status last;
    int sent = 0;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      StageMessage message;
      message.kind = MessageKind::kActivation;
      message.micro_batch = sent % 4;
      message.samples = 32;
      message.tensors = {Tensor::Host({8, 32})};
      last = stream->Send(std::move(message));
      if (!last.ok()) break;
      ++sent;
    }
    EXPECT_EQ(last.code(), absl::StatusCode::kUnavailable) << last;
    // The mailbox says why the stream ended: the next stage's refusal.
    absl::StatusOr<StageMessage> waited = executor->mailbox()->Receive(
        MessageKind::kGradient, 0, 0, 0,
        std::chrono::steady_clock::now() + std::chrono::seconds(20));
    ASSERT_FALSE(waited.ok());
    EXPECT_NE(waited.status().message().find("stream to the next stage"),
              std::string::npos)
        << waited.status();
    EXPECT_EQ(waited.status().message().find("timed out"), std::string::npos)
        << waited.status();
    stream->Close();
  }
  host->Shutdown();
  (*server)->Shutdown();
}

}  // namespace
}  // namespace pipetrain
