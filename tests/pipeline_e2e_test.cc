// K stage-worker processes on loopback train together over gRPC and match
// the in-process reference trainer; bad input and dead neighbours fail
// cleanly.
#include <signal.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/proto_json.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "services/rpc/grpc_util.h"
#include "services/wire/frame_codec.h"
#include "tests/cluster_harness.h"
#include "tests/raw_stream.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/pipeline/local_trainer.h"

namespace pipetrain::testing {
namespace {

using Clock = std::chrono::steady_clock;

v1::TrainingSpec LoadJob(const std::string& name) {
  v1::TrainingSpec spec;
  const absl::Status status =
      ReadJsonFile(SourcePath("examples/" + name), &spec);
  EXPECT_TRUE(status.ok()) << status;
  return spec;
}

using RunResult = PipelineRun;

// The in-process reference run: per-step losses and final weights, plus
// the weights it started from (to measure how far training moved them).
struct Reference {
  RunResult run;
  std::vector<std::vector<float>> initial_weights;
};

// Tolerances of a pipeline run against the reference. Losses: relative,
// |got - want| <= loss_rel * want. Weights: |got - want| <= weight_tol *
// max(1, |want|), i.e. absolute weight_tol where |want| <= 1 (every weight
// of these models, whose initial scale is 1/sqrt(fan-in) and which move
// little in a few steps) and relative above.
struct Tolerance {
  double loss_rel;
  double weight_tol;
};

// Euclidean norm of a - b.
double DistanceL2(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    sum += d * d;
  }
  return std::sqrt(sum);
}

class PipelineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    for (int i = 0; i < 4; ++i) {
      auto w = StartWorker();
      ASSERT_TRUE(w.ok()) << w.status();
      workers_.push_back(std::move(*w));
    }
  }
  static void TearDownTestSuite() { workers_.clear(); }

  static RunResult Run(const v1::TrainingSpec& spec,
                       const std::vector<int>& cuts,
                       v1::DType wire = v1::DTYPE_F32) {
    PipelineOptions options;
    options.wire = wire;
    return RunPipeline(workers_, absl::StrCat("job-", ++job_counter_), spec,
                       cuts, options);
  }

  static Reference TrainReference(const v1::TrainingSpec& spec) {
    Reference out;
    auto backend = CreateCpuBackend(1);
    auto trainer = LocalTrainer::Create(spec, backend.get());
    out.run.status = trainer.status();
    if (!out.run.status.ok()) return out;
    auto initial = (*trainer)->model()->ParamsToHost();
    out.run.status = initial.status();
    if (!out.run.status.ok()) return out;
    for (const Tensor& t : *initial)
      out.initial_weights.push_back(t.ToVector());
    for (int i = 0; i < spec.steps(); ++i) {
      auto r = (*trainer)->Step();
      out.run.status = r.status();
      if (!out.run.status.ok()) return out;
      out.run.losses.push_back(r->loss);
    }
    auto params = (*trainer)->model()->ParamsToHost();
    out.run.status = params.status();
    if (!out.run.status.ok()) return out;
    for (const Tensor& t : *params) out.run.weights.push_back(t.ToVector());
    return out;
  }

  static void ExpectClose(const RunResult& got, const RunResult& want,
                          Tolerance tol) {
    ASSERT_TRUE(got.status.ok()) << got.status;
    ASSERT_EQ(got.losses.size(), want.losses.size());
    for (size_t i = 0; i < want.losses.size(); ++i) {
      EXPECT_NEAR(got.losses[i], want.losses[i], tol.loss_rel * want.losses[i])
          << "step " << i << ": loss beyond relative tolerance "
          << tol.loss_rel;
    }
    ASSERT_EQ(got.weights.size(), want.weights.size());
    for (size_t p = 0; p < want.weights.size(); ++p) {
      ASSERT_EQ(got.weights[p].size(), want.weights[p].size());
      for (size_t i = 0; i < want.weights[p].size(); ++i) {
        const double w = want.weights[p][i];
        ASSERT_NEAR(got.weights[p][i], w,
                    tol.weight_tol * std::max(1.0, std::fabs(w)))
            << "param " << p << " element " << i << ": beyond "
            << tol.weight_tol << " (absolute where |want| <= 1)";
      }
    }
  }

  static std::vector<Worker> workers_;
  static int job_counter_;
};

std::vector<Worker> PipelineTest::workers_;
int PipelineTest::job_counter_ = 0;

// The pipeline does the in-process trainer's arithmetic, differing only in
// float summation order: losses within 1e-5 relative, weights within 1e-5
// absolute (all |w| < 1 here).
constexpr Tolerance kFloatSummationOrder{1e-5, 1e-5};

// Cut points for K = 1..4 stages of the 5-layer Fashion-MNIST MLP.
const std::vector<std::vector<int>> kMlpCuts = {{}, {2}, {2, 4}, {1, 2, 4}};

TEST_F(PipelineTest, GPipeMatchesTheInProcessTrainer) {
  for (int64_t m : {4, 8}) {
    for (bool remat : {false, true}) {
      v1::TrainingSpec spec = LoadJob("fashion_mnist_mlp.job.json");
      spec.set_micro_batches(m);
      spec.set_rematerialize(remat);
      spec.set_steps(6);
      const Reference want = TrainReference(spec);
      ASSERT_TRUE(want.run.status.ok()) << want.run.status;
      for (const auto& cuts : kMlpCuts) {
        SCOPED_TRACE(::testing::Message() << "M=" << m << " remat=" << remat
                                          << " K=" << cuts.size() + 1);
        ExpectClose(Run(spec, cuts), want.run, kFloatSummationOrder);
      }
    }
  }
}

// Interleaved 1F1B over gRPC: K workers with v = 2 chunks each of the
// 5-layer MLP; the last worker's wrap-around stream feeds worker 0's second
// chunk (K = 1: a worker's stream to itself).
TEST_F(PipelineTest, InterleavedMatchesTheInProcessTrainer) {
  for (int64_t m : {4, 8}) {
    v1::TrainingSpec spec = LoadJob("fashion_mnist_mlp.job.json");
    spec.set_micro_batches(m);
    spec.set_steps(6);
    const Reference want = TrainReference(spec);
    ASSERT_TRUE(want.run.status.ok()) << want.run.status;
    PipelineOptions options;
    options.schedule = v1::SCHEDULE_INTERLEAVED;
    options.virtual_stages = 2;
    for (const std::vector<int>& cuts :
         std::vector<std::vector<int>>{{1, 2, 4}, {2}}) {
      SCOPED_TRACE(::testing::Message()
                   << "M=" << m << " K=" << (cuts.size() + 1) / 2);
      ExpectClose(RunPipeline(workers_, absl::StrCat("job-", ++job_counter_),
                              spec, cuts, options),
                  want.run, kFloatSummationOrder);
    }
  }
}

// Half-precision activations and gradients on the wire (3 stages: both
// directions round at two cuts) make the run drift from the exact one in
// proportion to the format's unit roundoff u (bf16: 2^-8, fp16: 2^-11).
// Measured after 6 steps, per parameter tensor: ||w_wire - w_exact|| is at
// most 6.9u of the update ||w_exact - w_initial|| for both formats (bf16
// 2.69%, fp16 0.34%; fc2's bias the worst, the head ~10x better), and
// per-step losses differ by at most 0.03u (relative). Bounds: weights 10u of
// the update per tensor (bf16 3.9%, fp16 0.49%), relative to the update;
// losses 0.125u relative (bf16 4.9e-4, fp16 6.1e-5).
TEST_F(PipelineTest, HalfPrecisionWireDriftsInProportionToItsRoundoff) {
  v1::TrainingSpec spec = LoadJob("fashion_mnist_mlp.job.json");
  spec.set_steps(6);
  const Reference want = TrainReference(spec);
  ASSERT_TRUE(want.run.status.ok()) << want.run.status;
  for (const auto& [wire, u] :
       {std::pair{v1::DTYPE_BF16, std::ldexp(1.0, -8)},
        std::pair{v1::DTYPE_F16, std::ldexp(1.0, -11)}}) {
    SCOPED_TRACE(v1::DType_Name(wire));
    const RunResult got = Run(spec, {2, 4}, wire);
    ASSERT_TRUE(got.status.ok()) << got.status;
    ASSERT_EQ(got.losses.size(), want.run.losses.size());
    for (size_t i = 0; i < got.losses.size(); ++i) {
      EXPECT_NEAR(got.losses[i], want.run.losses[i],
                  0.125 * u * want.run.losses[i])
          << "step " << i << ": loss beyond relative tolerance " << 0.125 * u;
    }
    ASSERT_EQ(got.weights.size(), want.run.weights.size());
    for (size_t p = 0; p < got.weights.size(); ++p) {
      ASSERT_EQ(got.weights[p].size(), want.run.weights[p].size());
      const double update =
          DistanceL2(want.run.weights[p], want.initial_weights[p]);
      ASSERT_GT(update, 1e-3) << "param " << p << " did not train";
      const double drift = DistanceL2(got.weights[p], want.run.weights[p]);
      EXPECT_LE(drift, 10 * u * update)
          << "param " << p << ": ||w_wire - w_exact|| = " << drift << " beyond "
          << 10 * u << " of the update ||w_exact - w_initial|| = " << update
          << " (relative to the update)";
    }
  }
}

TEST_F(PipelineTest, CharTransformerTrainsAcrossTwoAndThreeStages) {
  for (const std::vector<int>& cuts :
       {std::vector<int>{2}, std::vector<int>{1, 3}}) {
    v1::TrainingSpec spec = LoadJob("char_transformer.job.json");
    spec.set_steps(40);
    const RunResult run = Run(spec, cuts);
    ASSERT_TRUE(run.status.ok()) << run.status;
    ASSERT_EQ(run.losses.size(), 40u);
    // An untrained model predicts bytes about uniformly: its first loss is
    // ln 256 within 0.5 nats (absolute); 40 steps take off at least 1 nat.
    EXPECT_NEAR(run.losses.front(), std::log(256.0), 0.5)
        << "first loss beyond 0.5 (absolute) of ln 256";
    EXPECT_LT(run.losses.back(), run.losses.front() - 1.0);
  }
}

std::vector<grpc::ByteBuffer> Frames(const std::string& job, int stage,
                                     const StageMessage& msg) {
  std::vector<grpc::ByteBuffer> frames = {EncodeHello(job, stage)};
  auto encoded = EncodeMessage(job, msg, v1::DTYPE_F32);
  EXPECT_TRUE(encoded.ok());
  for (auto& f : *encoded) frames.push_back(f);
  return frames;
}

TEST_F(PipelineTest, BadInputGetsClearErrorsAndTheWorkerKeepsServing) {
  v1::TrainingSpec spec = LoadJob("fashion_mnist_mlp.job.json");
  spec.set_steps(3);
  // Stage 1 of 2 on worker 1 (layers [2, 5)), configured but not training.
  v1::ConfigureRequest request;
  v1::StageConfig* c = request.mutable_config();
  c->set_job_id("bad-input");
  *c->mutable_spec() = spec;
  c->set_stage(1);
  c->set_num_stages(2);
  c->set_layer_begin(2);
  c->set_layer_end(5);
  {
    // An invalid layer range and an invalid spec.
    v1::ConfigureRequest bad = request;
    bad.mutable_config()->set_layer_end(9);
    grpc::ClientContext ctx;
    v1::ConfigureResponse response;
    const grpc::Status s = workers_[1].stub->Configure(&ctx, bad, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("layer range"), std::string::npos)
        << s.error_message();
    bad = request;
    bad.mutable_config()
        ->mutable_spec()
        ->mutable_model()
        ->mutable_layers(2)
        ->mutable_linear()
        ->set_in_features(7);
    grpc::ClientContext ctx2;
    const grpc::Status s2 = workers_[1].stub->Configure(&ctx2, bad, &response);
    EXPECT_EQ(s2.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s2.error_message().find("layers[2].linear.in_features"),
              std::string::npos)
        << s2.error_message();
  }
  {
    grpc::ClientContext ctx;
    v1::ConfigureResponse response;
    ASSERT_TRUE(workers_[1].stub->Configure(&ctx, request, &response).ok());
  }
  const int64_t rows = spec.batch_size() / spec.micro_batches();
  StageMessage good;
  good.kind = MessageKind::kActivation;
  good.samples = 60000;
  good.tensors = {Tensor::Host({rows, 256})};
  struct Case {
    const char* what;
    std::vector<grpc::ByteBuffer> frames;
    grpc::StatusCode code;
  };
  std::vector<Case> cases;
  {
    grpc::Slice junk(std::string("\x03\x00\x00\x00zzz", 7));
    cases.push_back({"garbage",
                     {grpc::ByteBuffer(&junk, 1)},
                     grpc::StatusCode::INVALID_ARGUMENT});
  }
  cases.push_back({"unknown job", Frames("no-such-job", 0, good),
                   grpc::StatusCode::NOT_FOUND});
  StageMessage wrong_shape = good;
  wrong_shape.tensors[0] = Tensor::Host({rows, 255});
  cases.push_back({"wrong shape", Frames("bad-input", 0, wrong_shape),
                   grpc::StatusCode::INVALID_ARGUMENT});
  StageMessage wrong_dtype = good;
  wrong_dtype.tensors[0] = Tensor::Host({rows, 256}, DType::kF16);
  cases.push_back({"wrong dtype", Frames("bad-input", 0, wrong_dtype),
                   grpc::StatusCode::INVALID_ARGUMENT});
  StageMessage unknown_step = good;
  unknown_step.step = 77;
  cases.push_back({"unknown step", Frames("bad-input", 0, unknown_step),
                   grpc::StatusCode::INVALID_ARGUMENT});
  StageMessage unknown_mb = good;
  unknown_mb.micro_batch = 99;
  cases.push_back({"unknown micro-batch", Frames("bad-input", 0, unknown_mb),
                   grpc::StatusCode::INVALID_ARGUMENT});
  {
    // A frame whose byte count disagrees with its tensors.
    auto frames = Frames("bad-input", 0, good);
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(frames[1].Dump(&slices).ok());
    grpc::ByteBuffer truncated(slices.data(), 1);  // header only, no payload
    v1::FrameHeader h;
    std::string header(reinterpret_cast<const char*>(slices[0].begin()) + 4,
                       slices[0].size() - 4);
    ASSERT_TRUE(h.ParseFromString(header));
    h.set_total_bytes(h.total_bytes() + 4);
    const std::string hb = h.SerializeAsString();
    std::string bytes(4, '\0');
    bytes[0] = static_cast<char>(hb.size() & 0xff);
    bytes[1] = static_cast<char>(hb.size() >> 8);
    bytes += hb;
    grpc::Slice bad(bytes);
    cases.push_back({"byte count",
                     {frames[0], grpc::ByteBuffer(&bad, 1)},
                     grpc::StatusCode::INVALID_ARGUMENT});
  }
  for (Case& c : cases) {
    RawStream stream(workers_[1].address, std::move(c.frames));
    const grpc::Status s = stream.Await();
    EXPECT_EQ(s.error_code(), c.code) << c.what << ": " << s.error_message();
    EXPECT_FALSE(s.error_message().empty()) << c.what;
  }
  // Unknown job on the control API.
  {
    v1::GetStatusRequest r;
    r.set_job_id("nope");
    grpc::ClientContext ctx;
    v1::GetStatusResponse response;
    EXPECT_EQ(workers_[1].stub->GetStatus(&ctx, r, &response).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  // The worker still serves: a real pipeline through it completes.
  const RunResult run = Run(spec, {2});
  EXPECT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.losses.size(), 3u);
}

TEST(PipelineFailure, ADeadNeighbourFailsTheStepInBoundedTime) {
  auto first = StartWorker();
  auto second = StartWorker();
  ASSERT_TRUE(first.ok() && second.ok());
  v1::TrainingSpec spec = LoadJob("fashion_mnist_mlp.job.json");
  spec.set_steps(100000);
  for (int s = 1; s >= 0; --s) {
    v1::ConfigureRequest request;
    v1::StageConfig* c = request.mutable_config();
    c->set_job_id("doomed");
    *c->mutable_spec() = spec;
    c->set_stage(s);
    c->set_num_stages(2);
    c->set_layer_begin(s == 0 ? 0 : 2);
    c->set_layer_end(s == 0 ? 2 : 5);
    if (s == 0) c->set_downstream(second->address);
    Worker& w = s == 0 ? *first : *second;
    grpc::ClientContext ctx;
    v1::ConfigureResponse response;
    ASSERT_TRUE(w.stub->Configure(&ctx, request, &response).ok());
    v1::TrainRequest train;
    train.set_job_id("doomed");
    train.set_until_step(spec.steps());
    grpc::ClientContext ctx2;
    v1::TrainResponse r2;
    ASSERT_TRUE(w.stub->Train(&ctx2, train, &r2).ok());
  }
  // Let a few steps run, then kill the last stage mid-step.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  second->process->Signal(SIGKILL);
  const auto killed = Clock::now();
  v1::GetStatusResponse status;
  while (Clock::now() - killed < std::chrono::seconds(15)) {
    v1::GetStatusRequest r;
    r.set_job_id("doomed");
    grpc::ClientContext ctx;
    ASSERT_TRUE(first->stub->GetStatus(&ctx, r, &status).ok());
    if (status.state() == v1::STAGE_STATE_FAILED) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(status.state(), v1::STAGE_STATE_FAILED)
      << "still " << status.state();
  EXPECT_GT(status.next_step(), 0);
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  EXPECT_TRUE(code == absl::StatusCode::kUnavailable ||
              code == absl::StatusCode::kAborted)
      << status.error();
  EXPECT_LT(Clock::now() - killed, std::chrono::seconds(10));
}

}  // namespace
}  // namespace pipetrain::testing
