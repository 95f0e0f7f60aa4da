// The stage host on the CPU backend, no transport: the calls a worker
// answers need a stage of the right job, Configure replaces the stage, a
// one-stage job trains to the reference trainer's weights, and a stage with
// a next stage opens its link through the opener once and closes it when it
// goes away.
#include "worker/pipeline/stage_host.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "common/proto_json.h"
#include "gtest/gtest.h"
#include "worker/compute/cpu/cpu_backend.h"
#include "worker/pipeline/local_trainer.h"

namespace pipetrain {
namespace {

v1::TrainingSpec Spec() {
  v1::TrainingSpec spec;
  const absl::Status status = ParseJson(R"({
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
    "optimizer": {"sgd": {"lr": 0.1, "momentum": 0.9}},
    "batchSize": 16, "microBatches": 4, "steps": 3, "seed": 3})",
                                        &spec);
  EXPECT_TRUE(status.ok()) << status;
  return spec;
}

// The whole model as one stage of job `job_id`.
v1::StageConfig OneStage(const std::string& job_id) {
  v1::StageConfig config;
  config.set_job_id(job_id);
  *config.mutable_spec() = Spec();
  config.set_num_stages(1);
  config.set_layer_end(3);
  config.set_schedule(v1::SCHEDULE_GPIPE);
  return config;
}

// Stage 0 of two: layers [0, 2), the next stage at `downstream`.
v1::StageConfig FirstOfTwo(const std::string& downstream) {
  v1::StageConfig config = OneStage("job");
  config.set_num_stages(2);
  config.set_layer_end(2);
  config.set_downstream(downstream);
  config.set_recv_timeout_s(30);
  return config;
}

// Records what a stage sends downstream; nothing comes back.
class RecordingLink : public DownstreamLink {
 public:
  absl::Status Send(StageMessage message) override {
    absl::MutexLock lock(&mu_);
    if (closed_) return absl::UnavailableError("closed");
    steps_.push_back(message.step);
    return absl::OkStatus();
  }
  void Close() override {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  bool closed() {
    absl::MutexLock lock(&mu_);
    return closed_;
  }
  size_t sent() {
    absl::MutexLock lock(&mu_);
    return steps_.size();
  }

 private:
  absl::Mutex mu_;
  bool closed_ = false;
  std::vector<int64_t> steps_;
};

// A host whose opener hands out RecordingLinks and remembers the calls.
struct LinkedHost {
  LinkedHost() {
    host = std::make_unique<StageHost>(
        CreateCpuBackend(1), nullptr,
        [this](const std::string& address, std::shared_ptr<StageExecutor>) {
          addresses.push_back(address);
          links.push_back(std::make_shared<RecordingLink>());
          return links.back();
        });
  }
  // Written by the opener, which the host calls from the test's thread.
  std::vector<std::string> addresses;
  std::vector<std::shared_ptr<RecordingLink>> links;
  std::unique_ptr<StageHost> host;
};

// Polls the stage until `done` holds for its status (10 s at most).
template <typename Done>
v1::GetStatusResponse WaitFor(StageHost* host, const std::string& job_id,
                              Done done) {
  v1::GetStatusResponse status;
  for (int i = 0; i < 1000; ++i) {
    absl::StatusOr<v1::GetStatusResponse> s = host->Status(job_id, 0);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return status;
    status = *s;
    if (done(status)) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "timed out; stage state "
                << v1::StageState_Name(status.state()) << " " << status.error();
  return status;
}

TEST(StageHostTest, CallsNeedAStageOfTheirJob) {
  StageHost host(CreateCpuBackend(1), nullptr);
  EXPECT_FALSE(host.Report(0).has_value());
  EXPECT_EQ(host.Status("job", 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(host.Train("job", 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(host.Weights("job").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(host.Trace("job", 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(host.Evaluate("job", 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(host.Stop("job").code(), absl::StatusCode::kFailedPrecondition);

  ASSERT_TRUE(host.Configure(OneStage("job")).ok());
  EXPECT_EQ(host.Status("other", 0).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(host.Train("other", 1).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(host.Stop("other").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(host.Evaluate("job", -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A refused Stop keeps the stage.
  EXPECT_TRUE(host.Report(0).has_value());
}

TEST(StageHostTest, ConfigureDescribesTheStageAndReplacesThePreviousOne) {
  StageHost host(CreateCpuBackend(1), nullptr);
  absl::StatusOr<v1::ConfigureResponse> configured =
      host.Configure(OneStage("a"));
  ASSERT_TRUE(configured.ok()) << configured.status();
  // 6 * 8 + 8 + 8 * 3 + 3 parameters; 256 samples in batches of 16.
  EXPECT_EQ(configured->num_parameters(), 83);
  EXPECT_EQ(std::vector<int64_t>(configured->input_shape().begin(),
                                 configured->input_shape().end()),
            std::vector<int64_t>{6});
  EXPECT_EQ(std::vector<int64_t>(configured->output_shape().begin(),
                                 configured->output_shape().end()),
            std::vector<int64_t>{3});
  EXPECT_EQ(configured->steps_per_epoch(), 16);

  ASSERT_TRUE(host.Configure(OneStage("b")).ok());
  EXPECT_EQ(host.Status("a", 0).status().code(), absl::StatusCode::kNotFound);
  std::optional<v1::StageReport> report = host.Report(0);
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->job_id(), "b");
  EXPECT_EQ(report->status().state(), v1::STAGE_STATE_CONFIGURED);

  // A bad config is refused before the current stage is touched.
  v1::StageConfig bad = OneStage("c");
  bad.set_layer_end(4);
  EXPECT_EQ(host.Configure(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  report = host.Report(0);
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->job_id(), "b");

  ASSERT_TRUE(host.Configure(OneStage("d")).ok());
  ASSERT_TRUE(host.Stop("d").ok());
  EXPECT_FALSE(host.Report(0).has_value());
}

TEST(StageHostTest, OneStageTrainsToTheReferenceWeights) {
  StageHost host(CreateCpuBackend(1), nullptr);
  ASSERT_TRUE(host.Configure(OneStage("job")).ok());
  absl::StatusOr<int64_t> until = host.Train("job", 3);
  ASSERT_TRUE(until.ok()) << until.status();
  EXPECT_EQ(*until, 3);
  const v1::GetStatusResponse done =
      WaitFor(&host, "job", [](const v1::GetStatusResponse& s) {
        return s.state() == v1::STAGE_STATE_DONE ||
               s.state() == v1::STAGE_STATE_FAILED;
      });
  ASSERT_EQ(done.state(), v1::STAGE_STATE_DONE) << done.error();
  EXPECT_EQ(done.results_size(), 3);
  std::optional<v1::StageReport> report = host.Report(2);
  ASSERT_TRUE(report.has_value());
  ASSERT_EQ(report->status().results_size(), 1);
  EXPECT_EQ(report->status().results(0).step(), 2);
  absl::StatusOr<v1::GetTraceResponse> trace = host.Trace("job", 2);
  ASSERT_TRUE(trace.ok());
  EXPECT_GT(trace->events_size(), 0);

  absl::StatusOr<v1::GetWeightsResponse> weights = host.Weights("job");
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ(weights->weight_version(), 3);

  auto backend = CreateCpuBackend(1);
  auto reference = LocalTrainer::Create(Spec(), backend.get());
  ASSERT_TRUE(reference.ok()) << reference.status();
  for (int s = 0; s < 3; ++s) ASSERT_TRUE((*reference)->Step().ok());
  auto expected = (*reference)->model()->ParamsToHost();
  ASSERT_TRUE(expected.ok());
  ASSERT_EQ(weights->weights_size(), static_cast<int>(expected->size()));
  for (int i = 0; i < weights->weights_size(); ++i) {
    const v1::TensorProto& got = weights->weights(i);
    const Tensor& want = (*expected)[i];
    ASSERT_EQ(got.data().size(), want.bytes()) << got.name();
    const float* g = reinterpret_cast<const float*>(got.data().data());
    for (int64_t j = 0; j < want.numel(); ++j) {
      EXPECT_NEAR(g[j], want.f32()[j], 1e-5) << got.name() << "[" << j << "]";
    }
  }
}

TEST(StageHostTest, OpensTheDownstreamLinkOnceAndClosesItWithTheStage) {
  LinkedHost linked;
  StageHost* host = linked.host.get();
  ASSERT_TRUE(host->Configure(FirstOfTwo("next:7100")).ok());
  ASSERT_TRUE(host->Train("job", 1).ok());
  // Stage 0 sends its micro-batches' activations, then waits for gradients.
  WaitFor(host, "job", [&](const v1::GetStatusResponse&) {
    return linked.links.size() == 1 && linked.links[0]->sent() == 4;
  });
  // Moving the target reuses the link; so does an evaluation.
  ASSERT_TRUE(host->Train("job", 2).ok());
  EXPECT_EQ(host->Evaluate("job", 0).status().code(),
            absl::StatusCode::kFailedPrecondition);  // training: refused
  ASSERT_EQ(linked.addresses, std::vector<std::string>{"next:7100"});

  // Profiling would time layers while the stage computes.
  v1::ProfileRequest profile;
  *profile.mutable_spec() = Spec();
  EXPECT_EQ(host->Profile(profile).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // A new stage gets a new link; the old one is closed.
  ASSERT_TRUE(host->Configure(FirstOfTwo("next:7200")).ok());
  EXPECT_TRUE(linked.links[0]->closed());
  ASSERT_TRUE(host->Train("job", 1).ok());
  ASSERT_EQ(linked.addresses.size(), 2u);
  EXPECT_EQ(linked.addresses[1], "next:7200");
  host->Shutdown();
  EXPECT_TRUE(linked.links[1]->closed());
  EXPECT_FALSE(host->Report(0).has_value());
}

TEST(StageHostTest, StageWithANextStageNeedsAnOpener) {
  StageHost host(CreateCpuBackend(1), nullptr);
  ASSERT_TRUE(host.Configure(FirstOfTwo("next:7100")).ok());
  EXPECT_EQ(host.Train("job", 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(StageHostTest, ARefusedConfigureLeavesTheTrainingStageRunning) {
  StageHost host(CreateCpuBackend(1), nullptr);
  v1::StageConfig config = OneStage("job");
  config.mutable_spec()->set_steps(1000000);
  ASSERT_TRUE(host.Configure(config).ok());
  ASSERT_TRUE(host.Train("job", 1000000).ok());
  std::vector<v1::StageConfig> refused(4, OneStage("intruder"));
  refused[0].set_layer_end(9);
  refused[1].mutable_spec()->set_batch_size(1099511627776);
  refused[2]
      .mutable_spec()
      ->mutable_model()
      ->mutable_layers(0)
      ->mutable_linear()
      ->set_out_features(int64_t{1} << 40);
  refused[3].mutable_spec()->mutable_data()->mutable_char_corpus()->add_files(
      "/dev/zero");
  refused[3].mutable_spec()->mutable_data()->mutable_char_corpus()->set_seq_len(
      4);
  for (const v1::StageConfig& bad : refused) {
    EXPECT_EQ(host.Configure(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad.spec().ShortDebugString();
  }
  const v1::GetStatusResponse status =
      WaitFor(&host, "job",
              [](const v1::GetStatusResponse& s) { return s.next_step() > 2; });
  EXPECT_EQ(status.state(), v1::STAGE_STATE_RUNNING);
  ASSERT_TRUE(host.Stop("job").ok());
}

TEST(StageHostTest, ProfileRefusesSizesBeforeAllocating) {
  StageHost host(CreateCpuBackend(1), nullptr);
  v1::ProfileRequest request;
  *request.mutable_spec() = Spec();
  request.set_batch(1099511627776);
  absl::StatusOr<v1::ProfileResponse> profile = host.Profile(request);
  EXPECT_EQ(profile.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(profile.status().message().find("1099511627776"), std::string::npos)
      << profile.status();
  request.set_batch(1 << 20);  // 2^20 rows x 2^12 features: 2^32 floats
  request.mutable_spec()->mutable_model()->set_input_shape(0, 4096);
  request.mutable_spec()
      ->mutable_model()
      ->mutable_layers(0)
      ->mutable_linear()
      ->set_in_features(4096);
  profile = host.Profile(request);
  EXPECT_EQ(profile.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StageHostTest, ProfilesEveryLayerWhenIdle) {
  StageHost host(CreateCpuBackend(1), nullptr);
  v1::ProfileRequest request;
  *request.mutable_spec() = Spec();
  request.set_repetitions(1);
  absl::StatusOr<v1::ProfileResponse> profile = host.Profile(request);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->layers_size(), 3);
  // The optimizer's update is timed for the layers that have parameters,
  // and only for them.
  for (const v1::LayerProfile& l : profile->layers()) {
    if (l.parameter_bytes() > 0) {
      EXPECT_GT(l.optimizer_seconds(), 0) << l.kind();
    } else {
      EXPECT_EQ(l.optimizer_seconds(), 0) << l.kind();
    }
  }
}

TEST(StageHostTest, ProfilesTheFastestRunsOverRoundsThroughTheLayers) {
  StageHost host(CreateCpuBackend(1), nullptr);
  v1::ProfileRequest request;
  *request.mutable_spec() = Spec();
  request.set_repetitions(5);  // five rounds of one run
  absl::StatusOr<v1::ProfileResponse> median = host.Profile(request);
  request.set_fastest(true);
  absl::StatusOr<v1::ProfileResponse> fastest = host.Profile(request);
  ASSERT_TRUE(median.ok()) << median.status();
  ASSERT_TRUE(fastest.ok()) << fastest.status();
  ASSERT_EQ(fastest->layers_size(), median->layers_size());
  for (int i = 0; i < fastest->layers_size(); ++i) {
    const v1::LayerProfile& f = fastest->layers(i);
    const v1::LayerProfile& m = median->layers(i);
    EXPECT_EQ(f.layer(), i);
    EXPECT_EQ(f.kind(), m.kind());
    EXPECT_EQ(f.activation_bytes(), m.activation_bytes());
    EXPECT_EQ(f.parameter_bytes(), m.parameter_bytes());
    EXPECT_GT(f.forward_seconds(), 0) << f.kind();
    EXPECT_GT(f.backward_seconds(), 0) << f.kind();
    EXPECT_EQ(f.optimizer_seconds() > 0, f.parameter_bytes() > 0) << f.kind();
  }
}

// The stage holding the last layer computes the loss for every
// micro-batch; its profile counts it. A ReLU over 2048 classes profiled as
// the last layer and, in a model one ReLU longer, as the one before it:
// only as the last does it hold a softmax cross-entropy and its gradient
// (an exponential per element, many times a ReLU's cost).
TEST(StageHostTest, TheLastLayersProfileCountsTheLoss) {
  StageHost host(CreateCpuBackend(1), nullptr);
  v1::ProfileRequest request;
  *request.mutable_spec() = Spec();
  v1::ModelSpec* model = request.mutable_spec()->mutable_model();
  model->mutable_layers(2)->mutable_linear()->set_out_features(2048);
  model->add_layers()->mutable_relu();
  request.set_batch(256);
  request.set_repetitions(5);
  request.set_fastest(true);
  v1::ProfileRequest longer = request;
  longer.mutable_spec()->mutable_model()->add_layers()->mutable_relu();
  absl::StatusOr<v1::ProfileResponse> as_last = host.Profile(request);
  absl::StatusOr<v1::ProfileResponse> as_inner = host.Profile(longer);
  ASSERT_TRUE(as_last.ok()) << as_last.status();
  ASSERT_TRUE(as_inner.ok()) << as_inner.status();
  ASSERT_EQ(as_last->layers_size(), 4);
  ASSERT_EQ(as_inner->layers_size(), 5);
  const v1::LayerProfile& last = as_last->layers(3);
  const v1::LayerProfile& inner = as_inner->layers(3);
  EXPECT_EQ(last.kind(), inner.kind());
  EXPECT_EQ(last.activation_bytes(), inner.activation_bytes());
  EXPECT_GT(last.forward_seconds(), 3 * inner.forward_seconds())
      << "as the last layer " << last.forward_seconds() << " s, inside "
      << inner.forward_seconds() << " s";
}

// A worker under a CPU quota (compute_share) reports its profile as that
// much slower: the short timed runs go at full speed within one quota
// period, the training it predicts does not.
TEST(StageHostTest, ProfilesAreScaledToTheComputeShare) {
  StageHost full(CreateCpuBackend(1), nullptr);
  StageHost tenth(CreateCpuBackend(1), nullptr, nullptr, 0.1);
  v1::ProfileRequest request;
  *request.mutable_spec() = Spec();
  request.set_repetitions(9);
  request.set_fastest(true);
  // The layers are tiny, so one profile lasts microseconds and a single
  // preemption can slow it several times over. Noise only ever adds
  // time: the fastest of several alternating profiles of each host is
  // what the two are compared on.
  double full_total = std::numeric_limits<double>::infinity();
  double tenth_total = std::numeric_limits<double>::infinity();
  for (int round = 0; round < 5; ++round) {
    absl::StatusOr<v1::ProfileResponse> at_full = full.Profile(request);
    absl::StatusOr<v1::ProfileResponse> at_tenth = tenth.Profile(request);
    ASSERT_TRUE(at_full.ok()) << at_full.status();
    ASSERT_TRUE(at_tenth.ok()) << at_tenth.status();
    ASSERT_EQ(at_tenth->layers_size(), at_full->layers_size());
    double full_round = 0;
    double tenth_round = 0;
    for (int i = 0; i < at_full->layers_size(); ++i) {
      const v1::LayerProfile& f = at_full->layers(i);
      const v1::LayerProfile& t = at_tenth->layers(i);
      full_round += f.forward_seconds() + f.backward_seconds();
      tenth_round += t.forward_seconds() + t.backward_seconds();
      EXPECT_EQ(t.activation_bytes(), f.activation_bytes());
      EXPECT_EQ(t.optimizer_seconds() > 0, f.optimizer_seconds() > 0);
    }
    full_total = std::min(full_total, full_round);
    tenth_total = std::min(tenth_total, tenth_round);
  }
  // Ten times as slow, within what timing the same layers twice varies.
  EXPECT_GT(tenth_total, 4 * full_total);
  EXPECT_LT(tenth_total, 25 * full_total);
}

}  // namespace
}  // namespace pipetrain
