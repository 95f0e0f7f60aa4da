// A cluster as `make demo` runs it: mutual TLS between every process
// (certificates made with openssl at test time), bearer tokens on the
// control API and a join token for workers. It trains a job, and refuses
// what an outsider, a viewer, a rogue worker or a forged heartbeat tries.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "services/auth/test_pki.h"
#include "services/http/test_http_client.h"
#include "services/rpc/grpc_util.h"
#include "services/rpc/transport_security.h"
#include "tests/scheduler_cluster.h"

namespace pipetrain::testing {
namespace {

constexpr char kOperator[] = "op-0123456789abcdef";
constexpr char kViewer[] = "view-0123456789abcdef";
constexpr char kJoin[] = "join-0123456789abcdef";

TransportSecurity Security(const CertFiles& files) {
  auto s = TransportSecurity::Create({files.cert, files.key, files.ca, false});
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : TransportSecurity();
}

std::vector<std::string> TlsFlags(const CertFiles& f) {
  return {"--tls_cert=" + f.cert, "--tls_key=" + f.key, "--tls_ca=" + f.ca};
}

// The code of a call; `token` goes in the authorization metadata.
using Call = std::function<grpc::Status(v1::SchedulerService::Stub*,
                                        grpc::ClientContext*)>;

class SecuredClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pki = TestPki::Create(dir_.path(), "cluster-ca");
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = *pki;
    for (const char* name :
         {"pipetrain-scheduler", "pipetrain-client", "pipetrain-worker-0",
          "pipetrain-worker-1", "pipetrain-worker-2"}) {
      auto files = pki_.Issue(name);
      ASSERT_TRUE(files.ok()) << files.status();
      certs_[name] = *files;
    }
    const std::string tokens = dir_.path() + "/tokens";
    std::ofstream(tokens) << "# test tokens\n"
                          << kOperator << " operator\n"
                          << kViewer << " viewer\n";
    const std::string join = dir_.path() + "/join.token";
    std::ofstream(join) << kJoin << "\n";
    // The harness's stubs are this test's: a user's client certificate.
    InstallProcessTransportSecurity(Security(certs_["pipetrain-client"]));

    std::vector<std::string> flags = SchedulerFlags();
    for (const std::string& f : TlsFlags(certs_["pipetrain-scheduler"])) {
      flags.push_back(f);
    }
    flags.push_back("--auth_tokens_file=" + tokens);
    flags.push_back("--join_token_file=" + join);
    auto s = StartScheduler(dir_.path() + "/data", flags);
    ASSERT_TRUE(s.ok()) << s.status();
    scheduler_ = std::move(*s);
    for (int i = 0; i < 3; ++i) {
      std::vector<std::string> w =
          TlsFlags(certs_[absl::StrCat("pipetrain-worker-", i)]);
      w.push_back("--scheduler=" + scheduler_.address);
      w.push_back("--join_token_file=" + join);
      auto worker = StartWorker(w);
      ASSERT_TRUE(worker.ok()) << worker.status();
      workers_.push_back(std::move(*worker));
    }
  }
  void TearDown() override {
    InstallProcessTransportSecurity(TransportSecurity());
  }

  grpc::Status Do(const std::string& token, const Call& call) {
    grpc::ClientContext context;
    context.set_deadline(DeadlineIn(30));
    if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
    return call(scheduler_.stub.get(), &context);
  }

  v1::ListWorkersResponse Workers() {
    v1::ListWorkersResponse r;
    EXPECT_TRUE(Do(kViewer, [&](auto* s, auto* c) {
                  return s->ListWorkers(c, {}, &r);
                }).ok());
    return r;
  }

  bool WaitForIdle(int n) {
    for (int i = 0; i < 200; ++i) {
      int idle = 0;
      const v1::ListWorkersResponse listed = Workers();
      for (const auto& w : listed.workers()) {
        idle += w.state() == v1::WORKER_STATE_IDLE;
      }
      if (idle >= n) return true;
      usleep(100 * 1000);
    }
    return false;
  }

  // A stub to `address` holding `name`'s certificate.
  std::unique_ptr<v1::StageService::Stub> StageAs(const std::string& name,
                                                  const std::string& address) {
    return v1::StageService::NewStub(CreatePipetrainChannel(
        address, Security(certs_[name]).ChannelCredentials()));
  }

  TempDir dir_;
  TestPki pki_;
  std::map<std::string, CertFiles> certs_;
  Scheduler scheduler_;
  std::vector<Worker> workers_;
};

TEST_F(SecuredClusterTest, TrainsAJobAndBindsWorkersToTheirCertificates) {
  ASSERT_TRUE(WaitForIdle(3));
  std::set<std::string> identities;
  const v1::ListWorkersResponse listed = Workers();
  for (const auto& w : listed.workers()) identities.insert(w.identity());
  EXPECT_EQ(identities,
            (std::set<std::string>{"pipetrain-worker-0", "pipetrain-worker-1",
                                   "pipetrain-worker-2"}));

  v1::SubmitJobRequest submit;
  *submit.mutable_spec()->mutable_training() = MlpSpec(30);
  submit.mutable_spec()->set_num_stages(3);
  v1::Job job;
  ASSERT_TRUE(Do(kOperator, [&](auto* s, auto* c) {
                return s->SubmitJob(c, submit, &job);
              }).ok());
  v1::Job seen;
  for (int i = 0; i < 1200; ++i) {
    v1::GetJobRequest get;
    get.set_job_id(job.id());
    ASSERT_TRUE(Do(kViewer, [&](auto* s, auto* c) {
                  return s->GetJob(c, get, &seen);
                }).ok());
    if (seen.state() == v1::JOB_STATE_COMPLETED ||
        seen.state() == v1::JOB_STATE_FAILED) {
      break;
    }
    usleep(100 * 1000);
  }
  ASSERT_EQ(seen.state(), v1::JOB_STATE_COMPLETED) << seen.error();
  EXPECT_EQ(seen.step(), 30);
}

TEST_F(SecuredClusterTest, TokenRoleMatrixOnEveryUserMethod) {
  v1::JobActionRequest action;
  action.set_job_id("job-none");
  struct Case {
    const char* name;
    bool operator_only;
    Call call;
  };
  const std::vector<Case> cases = {
      {"SubmitJob", true,
       [](auto* s, auto* c) {
         v1::Job r;
         return s->SubmitJob(c, v1::SubmitJobRequest(), &r);
       }},
      {"PauseJob", true,
       [&](auto* s, auto* c) {
         v1::Job r;
         return s->PauseJob(c, action, &r);
       }},
      {"ResumeJob", true,
       [&](auto* s, auto* c) {
         v1::Job r;
         return s->ResumeJob(c, action, &r);
       }},
      {"CancelJob", true,
       [&](auto* s, auto* c) {
         v1::Job r;
         return s->CancelJob(c, action, &r);
       }},
      {"Evaluate", true,
       [](auto* s, auto* c) {
         v1::EvalResult r;
         return s->Evaluate(c, v1::EvaluateRequest(), &r);
       }},
      {"GetJob", false,
       [](auto* s, auto* c) {
         v1::Job r;
         return s->GetJob(c, v1::GetJobRequest(), &r);
       }},
      {"ListJobs", false,
       [](auto* s, auto* c) {
         v1::ListJobsResponse r;
         return s->ListJobs(c, {}, &r);
       }},
      {"ListWorkers", false,
       [](auto* s, auto* c) {
         v1::ListWorkersResponse r;
         return s->ListWorkers(c, {}, &r);
       }},
      {"GetPlan", false,
       [](auto* s, auto* c) {
         v1::Plan r;
         return s->GetPlan(c, v1::GetPlanRequest(), &r);
       }},
      {"GetVersions", false,
       [](auto* s, auto* c) {
         v1::GetVersionsResponse r;
         return s->GetVersions(c, v1::GetVersionsRequest(), &r);
       }},
      {"GetJobTrace", false,
       [](auto* s, auto* c) {
         v1::GetJobTraceResponse r;
         return s->GetJobTrace(c, v1::GetJobTraceRequest(), &r);
       }},
  };
  auto denied = [](const grpc::Status& s) {
    return s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
           s.error_code() == grpc::StatusCode::PERMISSION_DENIED;
  };
  for (const Case& c : cases) {
    EXPECT_EQ(Do("", c.call).error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << c.name;
    EXPECT_EQ(Do("not-a-token", c.call).error_code(),
              grpc::StatusCode::UNAUTHENTICATED)
        << c.name;
    const grpc::Status viewer = Do(kViewer, c.call);
    if (c.operator_only) {
      EXPECT_EQ(viewer.error_code(), grpc::StatusCode::PERMISSION_DENIED)
          << c.name;
    } else {
      EXPECT_FALSE(denied(viewer)) << c.name << ": " << viewer.error_message();
    }
    const grpc::Status op = Do(kOperator, c.call);
    EXPECT_FALSE(denied(op)) << c.name << ": " << op.error_message();
  }
}

TEST_F(SecuredClusterTest, TokenRoleMatrixOnEveryRestRoute) {
  struct Route {
    const char* method;
    const char* path;
    bool operator_only;
  };
  const Route routes[] = {
      {"GET", "/v1/jobs", false},
      {"GET", "/v1/jobs/job-none", false},
      {"GET", "/v1/jobs/job-none/plan", false},
      {"GET", "/v1/jobs/job-none/versions", false},
      {"GET", "/v1/jobs/job-none/trace", false},
      {"GET", "/v1/workers", false},
      {"GET", "/metrics", false},
      {"POST", "/v1/jobs", true},
      {"POST", "/v1/jobs/job-none:pause", true},
      {"POST", "/v1/jobs/job-none:resume", true},
      {"POST", "/v1/jobs/job-none:cancel", true},
      {"POST", "/v1/jobs/job-none:evaluate", true},
  };
  // The scheduler has a certificate, so its REST port speaks only HTTPS.
  testing_http::ClientOptions https;
  https.ca_file = certs_["pipetrain-scheduler"].ca;
  auto status = [&](const Route& r, const std::string& token) {
    testing_http::Headers headers;
    if (!token.empty()) headers["Authorization"] = "Bearer " + token;
    auto response =
        testing_http::Send(scheduler_.http_port, r.method, r.path,
                           r.method[0] == 'P' ? "{}" : "", headers, https);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? response->status : 0;
  };
  for (const Route& r : routes) {
    EXPECT_EQ(status(r, ""), 401) << r.method << " " << r.path;
    EXPECT_EQ(status(r, "wrong"), 401) << r.method << " " << r.path;
    const int viewer = status(r, kViewer);
    if (r.operator_only) {
      EXPECT_EQ(viewer, 403) << r.method << " " << r.path;
    } else {
      EXPECT_TRUE(viewer != 401 && viewer != 403) << r.path << ": " << viewer;
    }
    const int op = status(r, kOperator);
    EXPECT_TRUE(op != 401 && op != 403) << r.path << ": " << op;
  }
  EXPECT_EQ(status({"GET", "/metrics", false}, kViewer), 200);
  EXPECT_EQ(status({"GET", "/v1/workers", false}, kViewer), 200);
  // Plain HTTP to that port gets no answer, with or without a token.
  auto plain =
      testing_http::Send(scheduler_.http_port, "GET", "/v1/workers", "",
                         {{"Authorization", absl::StrCat("Bearer ", kViewer)}});
  EXPECT_FALSE(plain.ok());
}

TEST_F(SecuredClusterTest, RefusesJoinsWithoutTheTokenAndForgedHeartbeats) {
  ASSERT_TRUE(WaitForIdle(3));
  const v1::WorkerInfo victim = Workers().workers(0);

  v1::RegisterWorkerRequest join;
  join.mutable_worker()->set_address("127.0.0.1:1");
  v1::RegisterWorkerResponse joined;
  EXPECT_EQ(Do("", [&](auto* s,
                       auto* c) { return s->RegisterWorker(c, join, &joined); })
                .error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  join.set_join_token("join-guess");
  EXPECT_EQ(Do("", [&](auto* s,
                       auto* c) { return s->RegisterWorker(c, join, &joined); })
                .error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  // The right join token, but another worker's id: no takeover.
  join.set_join_token(kJoin);
  join.mutable_worker()->set_id(victim.id());
  EXPECT_EQ(Do("", [&](auto* s,
                       auto* c) { return s->RegisterWorker(c, join, &joined); })
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  // A heartbeat in a real worker's name, with and without a guessed secret.
  for (const char* secret : {"", "0000"}) {
    v1::HeartbeatRequest beat;
    beat.set_worker_id(victim.id());
    beat.set_worker_secret(secret);
    v1::HeartbeatResponse r;
    EXPECT_EQ(Do(kOperator,
                 [&](auto* s, auto* c) { return s->Heartbeat(c, beat, &r); })
                  .error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  // The real worker is undisturbed.
  bool still_there = false;
  const v1::ListWorkersResponse listed = Workers();
  for (const auto& w : listed.workers()) {
    if (w.id() == victim.id()) {
      still_there =
          w.address() == victim.address() && w.state() == v1::WORKER_STATE_IDLE;
    }
  }
  EXPECT_TRUE(still_there);
}

TEST_F(SecuredClusterTest, StageTakesControlOnlyFromTheScheduler) {
  ASSERT_TRUE(WaitForIdle(3));
  const std::string address = workers_[1].address;
  v1::ConfigureRequest configure;
  v1::StageConfig* config = configure.mutable_config();
  config->set_job_id("job-x");
  *config->mutable_spec() = MlpSpec(10);
  config->set_stage(1);
  config->set_num_stages(2);
  config->set_layer_begin(2);
  config->set_layer_end(config->spec().model().layers_size());
  config->set_upstream_identity("pipetrain-worker-0");
  for (const char* intruder : {"pipetrain-client", "pipetrain-worker-0"}) {
    grpc::ClientContext c;
    c.set_deadline(DeadlineIn(30));
    v1::ConfigureResponse r;
    EXPECT_EQ(
        StageAs(intruder, address)->Configure(&c, configure, &r).error_code(),
        grpc::StatusCode::PERMISSION_DENIED)
        << intruder;
  }
  grpc::ClientContext c;
  c.set_deadline(DeadlineIn(30));
  v1::ConfigureResponse r;
  const grpc::Status as_scheduler =
      StageAs("pipetrain-scheduler", address)->Configure(&c, configure, &r);
  ASSERT_TRUE(as_scheduler.ok()) << as_scheduler.error_message();

  // Exchange: only the configured upstream may open a stream.
  auto exchange_as = [&](const std::string& name) {
    auto stub = StageAs(name, address);
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(30));
    auto stream = stub->Exchange(&ctx);
    stream->WritesDone();
    return stream->Finish();
  };
  EXPECT_EQ(exchange_as("pipetrain-worker-2").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(exchange_as("pipetrain-client").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(exchange_as("pipetrain-worker-0").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(SecuredClusterTest, PlaintextAndForeignCertificatesAreRefused) {
  auto plain = v1::SchedulerService::NewStub(CreatePipetrainChannel(
      scheduler_.address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext c1;
  c1.set_deadline(DeadlineIn(5));
  c1.AddMetadata("authorization", absl::StrCat("Bearer ", kOperator));
  v1::ListJobsResponse r;
  EXPECT_FALSE(plain->ListJobs(&c1, {}, &r).ok());

  auto rogue = TestPki::Create(dir_.path(), "rogue-ca");
  ASSERT_TRUE(rogue.ok());
  auto mallory = rogue->Issue("pipetrain-scheduler");
  ASSERT_TRUE(mallory.ok());
  CertFiles files = *mallory;
  files.ca = pki_.ca_file();  // she trusts the cluster, it does not trust her
  auto stage = v1::StageService::NewStub(CreatePipetrainChannel(
      workers_[0].address, Security(files).ChannelCredentials()));
  grpc::ClientContext c2;
  c2.set_deadline(DeadlineIn(5));
  v1::StopResponse stopped;
  EXPECT_FALSE(stage->Stop(&c2, v1::StopRequest(), &stopped).ok());
}

// Runs `binary` with `args`; its exit status and output.
std::pair<int, std::string> RunToExit(const std::string& binary,
                                      const std::string& args) {
  const std::string command = BinaryPath(binary) + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  char buffer[512];
  while (pipe != nullptr && fgets(buffer, sizeof(buffer), pipe) != nullptr) {
    output += buffer;
  }
  const int status = pipe != nullptr ? pclose(pipe) : -1;
  return {status, output};
}

TEST(SecureStartTest, PlaintextOffLoopbackFailsAtStartNamingTheFlag) {
  TempDir dir;
  auto [code, out] = RunToExit(
      "pipetrain-scheduler",
      "--listen=0.0.0.0:0 --http_host=127.0.0.1 --http_port=0 --data_dir=" +
          dir.path());
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("--listen 0.0.0.0:0 is not a loopback address"),
            std::string::npos)
      << out;
  std::tie(code, out) = RunToExit(
      "pipetrain-worker",
      "--listen=127.0.0.1:0 --metrics_port=-1 --scheduler=10.255.0.1:7000");
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("--scheduler 10.255.0.1:7000"), std::string::npos) << out;
  // Plain HTTP (REST, /metrics) off loopback is refused the same way.
  std::tie(code, out) = RunToExit(
      "pipetrain-scheduler",
      "--listen=127.0.0.1:0 --http_host=0.0.0.0 --http_port=0 --data_dir=" +
          dir.path());
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("--http_host 0.0.0.0 is not a loopback address"),
            std::string::npos)
      << out;
  std::tie(code, out) =
      RunToExit("pipetrain-worker",
                "--listen=127.0.0.1:0 --metrics_port=0 --metrics_host=0.0.0.0 "
                "--scheduler=127.0.0.1:7000");
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("--metrics_host 0.0.0.0"), std::string::npos) << out;
}

TEST(SecureStartTest, OpenControlApiOffLoopbackNeedsTokensOrInsecure) {
  TempDir dir;
  // With a certificate, so that HTTPS may listen on every interface.
  auto pki = TestPki::Create(dir.path(), "cluster-ca");
  ASSERT_TRUE(pki.ok()) << pki.status();
  auto cert = pki->Issue("pipetrain-scheduler");
  ASSERT_TRUE(cert.ok()) << cert.status();
  auto [code, out] = RunToExit(
      "pipetrain-scheduler",
      absl::StrCat("--listen=127.0.0.1:0 --http_host=0.0.0.0 --http_port=0 ",
                   absl::StrJoin(TlsFlags(*cert), " "),
                   " --data_dir=", dir.path()));
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("--auth_tokens_file"), std::string::npos) << out;
}

TEST(SecureStartTest, ABadTokensLineNamesTheLineNotTheToken) {
  TempDir dir;
  const std::string tokens = dir.path() + "/tokens";
  std::ofstream(tokens) << "# ok\ngood-token viewer\nsecret-xyz admin\n";
  auto [code, out] = RunToExit("pipetrain-scheduler",
                               "--listen=127.0.0.1:0 --http_host=127.0.0.1 "
                               "--http_port=0 --auth_tokens_file=" +
                                   tokens + " --data_dir=" + dir.path());
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find(tokens + ":3:"), std::string::npos) << out;
  EXPECT_EQ(out.find("secret-xyz"), std::string::npos) << out;
  EXPECT_EQ(out.find("good-token"), std::string::npos) << out;
}

}  // namespace
}  // namespace pipetrain::testing
