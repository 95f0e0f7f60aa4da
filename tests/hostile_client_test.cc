// Hostile clients against a running job. A real job trains on three worker
// processes over loopback while clients send garbage and oversize frames,
// frames before HELLO, a rogue upstream's HELLO with replayed and
// wrong-shaped frames after it, invalid Configure and Profile calls, and bad
// specs, oversize bodies and deep JSON to a scheduler's REST and gRPC
// APIs. Each gets its documented code (docs/LIMITS.md), no process dies,
// the logs name the rejected peer, and the job ends with the weights of an
// undisturbed in-process run.
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/proto_json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/http/test_http_client.h"
#include "services/rpc/grpc_util.h"
#include "services/wire/frame_codec.h"
#include "tests/cluster_harness.h"
#include "tests/raw_stream.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/pipeline/local_trainer.h"

namespace pipetrain::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kJob[] = "hostile-target";
constexpr int64_t kSteps = 40;
// Stage 0 trains to here first; the attacks come while stages 1 and 2 wait
// in the middle of the job for step kPauseAt's activations.
constexpr int64_t kPauseAt = 20;
constexpr int64_t kHugeBatch = 1099511627776;  // 2^40, the reported spec
// The 5-layer MLP cut into [0, 2), [2, 4), [4, 5).
const std::vector<int> kBounds = {0, 2, 4, 5};

v1::TrainingSpec Spec() {
  v1::TrainingSpec spec;
  const absl::Status read =
      ReadJsonFile(SourcePath("examples/fashion_mnist_mlp.job.json"), &spec);
  EXPECT_TRUE(read.ok()) << read;
  spec.set_epochs(0);
  spec.set_steps(kSteps);
  return spec;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status Call(const grpc::Status& status) { return FromGrpcStatus(status); }

v1::ConfigureRequest ConfigureFor(const std::vector<Worker>& workers, int s) {
  v1::ConfigureRequest request;
  v1::StageConfig* c = request.mutable_config();
  c->set_job_id(kJob);
  *c->mutable_spec() = Spec();
  c->set_stage(s);
  c->set_num_stages(3);
  c->set_layer_begin(kBounds[s]);
  c->set_layer_end(kBounds[s + 1]);
  if (s < 2) c->set_downstream(workers[s + 1].address);
  c->set_schedule(v1::SCHEDULE_GPIPE);
  c->set_recv_timeout_s(60);
  return request;
}

absl::Status Configure(Worker& w, const v1::ConfigureRequest& request) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(60));
  v1::ConfigureResponse response;
  return Call(w.stub->Configure(&ctx, request, &response));
}

absl::Status Train(Worker& w, int64_t until) {
  v1::TrainRequest request;
  request.set_job_id(kJob);
  request.set_until_step(until);
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(30));
  v1::TrainResponse response;
  return Call(w.stub->Train(&ctx, request, &response));
}

v1::GetStatusResponse Status(Worker& w) {
  v1::GetStatusRequest request;
  request.set_job_id(kJob);
  request.set_results_since(1 << 30);
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(10));
  v1::GetStatusResponse response;
  const absl::Status rpc = Call(w.stub->GetStatus(&ctx, request, &response));
  EXPECT_TRUE(rpc.ok()) << rpc;
  return response;
}

// Waits until `w`'s stage is DONE at `step`; false on failure or timeout.
bool AwaitDone(Worker& w, int64_t step) {
  for (int i = 0; i < 3000; ++i) {
    const v1::GetStatusResponse s = Status(w);
    if (s.state() == v1::STAGE_STATE_FAILED) {
      ADD_FAILURE() << "stage failed: " << s.error();
      return false;
    }
    if (s.state() == v1::STAGE_STATE_DONE && s.next_step() == step) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ADD_FAILURE() << "stage not done at step " << step;
  return false;
}

// Every stage's parameters, in model order (stages hold consecutive
// layers).
std::vector<std::vector<float>> PipelineWeights(std::vector<Worker>& workers) {
  std::vector<std::vector<float>> out;
  for (Worker& w : workers) {
    v1::GetWeightsRequest request;
    request.set_job_id(kJob);
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(30));
    v1::GetWeightsResponse response;
    const absl::Status rpc = Call(w.stub->GetWeights(&ctx, request, &response));
    EXPECT_TRUE(rpc.ok()) << rpc;
    for (const v1::TensorProto& t : response.weights()) {
      const float* f = reinterpret_cast<const float*>(t.data().data());
      out.emplace_back(f, f + t.data().size() / sizeof(float));
    }
  }
  return out;
}

std::vector<std::vector<float>> ReferenceWeights() {
  std::vector<std::vector<float>> out;
  std::unique_ptr<Backend> backend = CreateCpuBackend(1);
  absl::StatusOr<std::unique_ptr<LocalTrainer>> trainer =
      LocalTrainer::Create(Spec(), backend.get());
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return out;
  for (int64_t i = 0; i < kSteps; ++i) {
    const absl::Status step = (*trainer)->Step().status();
    EXPECT_TRUE(step.ok()) << step;
  }
  absl::StatusOr<std::vector<Tensor>> params =
      (*trainer)->model()->ParamsToHost();
  EXPECT_TRUE(params.ok()) << params.status();
  if (params.ok()) {
    for (const Tensor& t : *params) out.push_back(t.ToVector());
  }
  return out;
}

// A frame of the header alone: [u32 length][FrameHeader].
grpc::ByteBuffer HeaderOnlyFrame(const v1::FrameHeader& h) {
  const std::string header = h.SerializeAsString();
  std::string bytes(4, '\0');
  for (int i = 0; i < 4; ++i) {
    bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  }
  bytes += header;
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// A step-0, micro-batch-0 activation for stage 1 (what stage 0 sent at the
// start of the job): replayed, or with `features` columns, or in `dtype`.
std::vector<grpc::ByteBuffer> Activation(int64_t features,
                                         DType dtype = DType::kF32) {
  StageMessage m;
  m.kind = MessageKind::kActivation;
  m.samples = 1024;
  m.tensors = {Tensor::Host({16, features}, dtype)};
  absl::StatusOr<std::vector<grpc::ByteBuffer>> frames =
      EncodeMessage(kJob, m, v1::DTYPE_F32);
  EXPECT_TRUE(frames.ok()) << frames.status();
  return frames.ok() ? *frames : std::vector<grpc::ByteBuffer>();
}

struct StreamAttack {
  std::string what;
  int worker;
  std::vector<grpc::ByteBuffer> frames;
  grpc::StatusCode code;
};

std::vector<StreamAttack> StreamAttacks() {
  std::vector<StreamAttack> attacks;
  grpc::Slice junk(std::string("\x03\x00\x00\x00zzz", 7));
  attacks.push_back({"garbage",
                     1,
                     {grpc::ByteBuffer(&junk, 1)},
                     grpc::StatusCode::INVALID_ARGUMENT});
  attacks.push_back({"payload before HELLO", 1, Activation(256),
                     grpc::StatusCode::FAILED_PRECONDITION});
  attacks.push_back({"fp16 payload where float32 travels", 1,
                     Activation(256, DType::kF16),
                     grpc::StatusCode::INVALID_ARGUMENT});
  // A header declaring 2^31 floats (8 GiB) with no HELLO: refused before
  // the assembler allocates.
  v1::FrameHeader huge;
  huge.set_kind(v1::FRAME_KIND_ACTIVATION);
  huge.set_job_id(kJob);
  v1::TensorMeta* meta = huge.add_tensors();
  meta->set_dtype(v1::DTYPE_F32);
  meta->add_shape(int64_t{1} << 30);
  meta->add_shape(2);
  huge.set_total_bytes(int64_t{1} << 33);
  attacks.push_back({"8 GiB frame before HELLO",
                     2,
                     {HeaderOnlyFrame(huge)},
                     grpc::StatusCode::FAILED_PRECONDITION});
  // A rogue upstream: the running job's previous stage, but a live stream
  // holds that place; what it sends after is never read.
  attacks.push_back({"rogue upstream replaying step 0", 1,
                     Join({EncodeHello(kJob, 0)}, Activation(256)),
                     grpc::StatusCode::ALREADY_EXISTS});
  attacks.push_back({"rogue upstream with a wrong shape", 2,
                     Join({EncodeHello(kJob, 1)}, Activation(255)),
                     grpc::StatusCode::ALREADY_EXISTS});
  attacks.push_back({"rogue upstream with an 8 GiB frame",
                     2,
                     {EncodeHello(kJob, 1), HeaderOnlyFrame(huge)},
                     grpc::StatusCode::ALREADY_EXISTS});
  attacks.push_back({"HELLO from a stage that is not the previous one",
                     1,
                     {EncodeHello(kJob, 1)},
                     grpc::StatusCode::INVALID_ARGUMENT});
  attacks.push_back({"HELLO for another job",
                     1,
                     {EncodeHello("someone-elses-job", 0)},
                     grpc::StatusCode::NOT_FOUND});
  return attacks;
}

// Invalid control calls; each must leave the running stage as it was.
void AttackControlCalls(std::vector<Worker>& workers) {
  v1::ConfigureRequest bad_range = ConfigureFor(workers, 1);
  bad_range.mutable_config()->set_layer_end(9);
  absl::Status s = Configure(workers[1], bad_range);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("layer range"));

  v1::ConfigureRequest huge = ConfigureFor(workers, 2);
  huge.mutable_config()->mutable_spec()->set_batch_size(kHugeBatch);
  s = Configure(workers[2], huge);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("1099511627776"));

  v1::ConfigureRequest zero = ConfigureFor(workers, 0);
  v1::DatasetSpec* data = zero.mutable_config()->mutable_spec()->mutable_data();
  data->mutable_char_corpus()->add_files("/dev/zero");
  data->mutable_char_corpus()->set_seq_len(8);
  s = Configure(workers[0], zero);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(s.message(), HasSubstr("outside the worker's data roots"));

  v1::ProfileRequest profile;
  *profile.mutable_spec() = Spec();
  profile.set_batch(kHugeBatch);
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(30));
  v1::ProfileResponse response;
  s = Call(workers[0].stub->Profile(&ctx, profile, &response));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("1099511627776"));
}

// Bad specs, oversize bodies and deep JSON against a scheduler; the
// README's own submission works.
void AttackScheduler(Scheduler& scheduler) {
  namespace http = testing_http;
  v1::JobSpec job;
  *job.mutable_training() = Spec();
  job.mutable_training()->set_batch_size(kHugeBatch);
  absl::StatusOr<http::ClientResponse> r =
      http::Send(scheduler.http_port, "POST", "/v1/jobs", ToApiJson(job));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_THAT(r->body, HasSubstr("batch_size: 1099511627776"));

  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = job;
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(10));
  v1::Job created;
  const absl::Status s =
      Call(scheduler.stub->SubmitJob(&ctx, submit, &created));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("1099511627776"));

  // The scheduler runs with --http_max_body_bytes=65536.
  r = http::Send(scheduler.http_port, "POST", "/v1/jobs",
                 std::string(70000, ' '));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 413);
  absl::StatusOr<int> declared = http::RawStatus(
      scheduler.http_port,
      "POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
      "Connection: close\r\nContent-Length: 8589934592\r\n\r\n");
  ASSERT_TRUE(declared.ok()) << declared.status();
  EXPECT_EQ(*declared, 413);

  const std::string deep = absl::StrCat("{\"name\": ", std::string(5000, '['),
                                        std::string(5000, ']'), "}");
  r = http::Send(scheduler.http_port, "POST", "/v1/jobs", deep);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 400);
  EXPECT_THAT(r->body, HasSubstr("nested deeper than"));

  // Removing a worker without naming one (the route's prefix alone, an
  // empty id, a path below an id) is not a route.
  for (const char* path : {"/v1/workers", "/v1/workers/", "/v1/workers/a/b"}) {
    r = http::Send(scheduler.http_port, "DELETE", path);
    ASSERT_TRUE(r.ok()) << path << ": " << r.status();
    EXPECT_EQ(r->status, 404) << path << ": " << r->body;
  }

  // curl -X POST localhost:8080/v1/jobs -d @examples/fashion_mnist_mlp.job.json
  r = http::Send(scheduler.http_port, "POST", "/v1/jobs",
                 ReadFile(SourcePath("examples/fashion_mnist_mlp.job.json")));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_THAT(r->body, HasSubstr("\"name\":\"fashion-mnist-mlp\""));
}

TEST(HostileClients, TheJobSurvivesThemAndEveryOneGetsItsCode) {
  std::vector<Worker> workers;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<Worker> w = StartWorker();
    ASSERT_TRUE(w.ok()) << w.status();
    workers.push_back(std::move(*w));
  }
  TempDir dir;
  absl::StatusOr<Scheduler> scheduler =
      StartScheduler(dir.path(), {"--http_max_body_bytes=65536"});
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();

  for (int s = 2; s >= 0; --s) {
    ASSERT_TRUE(Configure(workers[s], ConfigureFor(workers, s)).ok());
  }
  ASSERT_TRUE(Train(workers[2], kSteps).ok());
  ASSERT_TRUE(Train(workers[1], kSteps).ok());
  ASSERT_TRUE(Train(workers[0], kPauseAt).ok());
  ASSERT_TRUE(AwaitDone(workers[0], kPauseAt));
  // Mid-job: stages 1 and 2 run, waiting for step kPauseAt.
  ASSERT_EQ(Status(workers[1]).state(), v1::STAGE_STATE_RUNNING);
  ASSERT_EQ(Status(workers[2]).state(), v1::STAGE_STATE_RUNNING);

  for (StreamAttack& a : StreamAttacks()) {
    RawStream stream(workers[a.worker].address, std::move(a.frames));
    const grpc::Status s = stream.Await();
    EXPECT_EQ(s.error_code(), a.code) << a.what << ": " << s.error_message();
    EXPECT_FALSE(s.error_message().empty()) << a.what;
  }
  AttackControlCalls(workers);
  AttackScheduler(*scheduler);
  EXPECT_EQ(Status(workers[1]).state(), v1::STAGE_STATE_RUNNING);
  EXPECT_EQ(Status(workers[2]).state(), v1::STAGE_STATE_RUNNING);

  ASSERT_TRUE(Train(workers[0], kSteps).ok());
  for (Worker& w : workers) ASSERT_TRUE(AwaitDone(w, kSteps));
  const std::vector<std::vector<float>> got = PipelineWeights(workers);
  const std::vector<std::vector<float>> want = ReferenceWeights();
  ASSERT_EQ(got.size(), want.size());
  for (size_t p = 0; p < want.size(); ++p) {
    ASSERT_EQ(got[p].size(), want[p].size());
    for (size_t i = 0; i < want[p].size(); ++i) {
      ASSERT_NEAR(got[p][i], want[p][i], 1e-5)
          << "param " << p << " element " << i << " (absolute tolerance)";
    }
  }
  for (Worker& w : workers) EXPECT_TRUE(w.process->Running());
  EXPECT_TRUE(scheduler->process->Running());
  // The rejected streams' peers are named: loopback clients.
  EXPECT_THAT(ReadFile(workers[1].process->log_path()),
              HasSubstr("rejected a frame from ipv4:127.0.0.1:"));
}

}  // namespace
}  // namespace pipetrain::testing
