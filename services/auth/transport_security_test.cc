// Mutual TLS as the services use it: a server built from
// TransportSecurity accepts only clients with a certificate from its CA and
// tells the handler who they are.
#include "services/rpc/transport_security.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "pipetrain/v1/scheduler.grpc.pb.h"
#include "services/auth/test_pki.h"
#include "services/rpc/grpc_server.h"
#include "services/rpc/grpc_util.h"

namespace pipetrain {
namespace {

// Answers ListJobs with one job whose id is the caller's primary identity
// (prefixed "tls:" when authenticated by certificate).
class WhoAmIService final : public v1::SchedulerService::CallbackService {
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest*,
                                     v1::ListJobsResponse* response) override {
    const PeerIdentity peer = PeerOf(*context);
    response->add_jobs()->set_id(
        absl::StrCat(peer.authenticated ? "tls:" : "plain:", peer.Primary()));
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

TransportSecurity Security(const CertFiles& files) {
  absl::StatusOr<TransportSecurity> s =
      TransportSecurity::Create({files.cert, files.key, files.ca, false});
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : TransportSecurity();
}

class MutualTlsTest : public testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/pipetrain-tls-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    absl::StatusOr<TestPki> pki = TestPki::Create(dir_, "cluster-ca");
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = *pki;
    absl::StatusOr<TestPki> rogue = TestPki::Create(dir_, "rogue-ca");
    ASSERT_TRUE(rogue.ok()) << rogue.status();
    rogue_ = *rogue;
    absl::StatusOr<CertFiles> server = pki_.Issue("pipetrain-scheduler");
    ASSERT_TRUE(server.ok()) << server.status();
    auto started = StartGrpcServer("127.0.0.1:0", &service_, &port_,
                                   Security(*server).ServerCredentials());
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = *std::move(started);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(DeadlineIn(1));
    std::system(absl::StrCat("rm -rf ", dir_).c_str());
  }

  // The caller's identity as the server saw it, or the call's error.
  absl::StatusOr<std::string> Call(
      std::shared_ptr<grpc::ChannelCredentials> credentials) {
    auto stub = v1::SchedulerService::NewStub(CreatePipetrainChannel(
        absl::StrCat("127.0.0.1:", port_), std::move(credentials)));
    grpc::ClientContext context;
    context.set_deadline(DeadlineIn(5));
    v1::ListJobsResponse response;
    absl::Status status = FromGrpcStatus(
        stub->ListJobs(&context, v1::ListJobsRequest(), &response));
    if (!status.ok()) return status;
    return response.jobs(0).id();
  }

  std::string dir_;
  TestPki pki_, rogue_;
  WhoAmIService service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(MutualTlsTest, AcceptsAClientOfTheClusterCaAndNamesIt) {
  absl::StatusOr<CertFiles> alice = pki_.Issue("alice");
  ASSERT_TRUE(alice.ok());
  absl::StatusOr<std::string> who = Call(Security(*alice).ChannelCredentials());
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(*who, "tls:alice");
}

TEST_F(MutualTlsTest, RefusesAClientCertificateFromAnotherCa) {
  absl::StatusOr<CertFiles> mallory = rogue_.Issue("pipetrain-scheduler");
  ASSERT_TRUE(mallory.ok());
  // Mallory trusts the real CA (she can reach the server) but her own
  // certificate comes from her CA.
  CertFiles files = *mallory;
  files.ca = pki_.ca_file();
  EXPECT_FALSE(Call(Security(files).ChannelCredentials()).ok());
}

TEST_F(MutualTlsTest, RefusesAClientWithoutCertificate) {
  // Trusts the server, presents nothing.
  grpc::SslCredentialsOptions options;
  std::ifstream ca(pki_.ca_file());
  options.pem_root_certs.assign(std::istreambuf_iterator<char>(ca), {});
  EXPECT_FALSE(Call(grpc::SslCredentials(options)).ok());
}

TEST_F(MutualTlsTest, RefusesPlaintext) {
  EXPECT_FALSE(Call(grpc::InsecureChannelCredentials()).ok());
}

TEST_F(MutualTlsTest, ClientRefusesAServerFromAnotherCa) {
  absl::StatusOr<CertFiles> alice = pki_.Issue("alice");
  ASSERT_TRUE(alice.ok());
  CertFiles files = *alice;
  files.ca = rogue_.ca_file();
  EXPECT_FALSE(Call(Security(files).ChannelCredentials()).ok());
}

TEST(PlaintextServerTest, NamesThePeerByHost) {
  WhoAmIService service;
  int port = 0;
  auto server = StartGrpcServer("127.0.0.1:0", &service, &port,
                                grpc::InsecureServerCredentials());
  ASSERT_TRUE(server.ok());
  auto stub = v1::SchedulerService::NewStub(CreatePipetrainChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(5));
  v1::ListJobsResponse response;
  ASSERT_TRUE(stub->ListJobs(&context, {}, &response).ok());
  EXPECT_EQ(response.jobs(0).id(), "plain:127.0.0.1");
  (*server)->Shutdown(DeadlineIn(1));
}

TEST(TransportSecurityTest, WantsAllThreeFilesOrNone) {
  auto partial = TransportSecurity::Create({"a.crt", "", "", false});
  EXPECT_EQ(partial.status().code(), absl::StatusCode::kInvalidArgument);
  auto missing = TransportSecurity::Create(
      {"/nonexistent.crt", "/nonexistent.key", "/nonexistent.ca", false});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("--tls_cert"), std::string::npos);
}

TEST(TransportSecurityTest, PlaintextOnlyOnLoopbackUnlessInsecure) {
  const TransportSecurity plain;
  EXPECT_TRUE(plain.CheckAddress("--listen", "127.0.0.1:7000").ok());
  EXPECT_TRUE(plain.CheckAddress("--listen", "localhost:7000").ok());
  EXPECT_TRUE(plain.CheckAddress("--listen", "[::1]:7000").ok());
  const absl::Status open = plain.CheckAddress("--listen", "0.0.0.0:7000");
  EXPECT_EQ(open.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(open.message().find("--listen 0.0.0.0:7000"), std::string::npos);
  EXPECT_NE(open.message().find("--insecure"), std::string::npos);
  EXPECT_FALSE(plain.CheckAddress("--scheduler", "10.1.2.3:7000").ok());
  auto insecure = TransportSecurity::Create({"", "", "", true});
  ASSERT_TRUE(insecure.ok());
  EXPECT_TRUE(insecure->CheckAddress("--listen", "0.0.0.0:7000").ok());
}

TEST(TransportSecurityTest, LoopbackAddresses) {
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.2:9"));
  EXPECT_TRUE(IsLoopbackAddress("ipv4:127.0.0.1:5555"));
  EXPECT_TRUE(IsLoopbackAddress("::1"));
  EXPECT_TRUE(IsLoopbackAddress("unix:/tmp/s"));
  EXPECT_FALSE(IsLoopbackAddress(""));
  EXPECT_FALSE(IsLoopbackAddress("[::]:7000"));
  EXPECT_FALSE(IsLoopbackAddress("scheduler:7000"));
  EXPECT_FALSE(IsLoopbackAddress("128.0.0.1:7000"));
}

}  // namespace
}  // namespace pipetrain
