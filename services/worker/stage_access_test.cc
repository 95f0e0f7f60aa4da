// Who may call a stage: control calls only the scheduler, Exchange only the
// configured upstream, Probe and ProbeExchange any peer with a certificate
// of the cluster.
#include "services/worker/stage_access.h"

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

PeerIdentity Peer(bool authenticated, const std::string& name) {
  PeerIdentity peer;
  peer.authenticated = authenticated;
  peer.names = {name};
  peer.address = "ipv4:10.0.0.9:5000";
  return peer;
}

TEST(StageAccessTest, ProbesComeFromAnyPeerOfTheCluster) {
  const StageAccess access(true, "pipetrain-scheduler");
  for (const char* method : {"Probe", "ProbeExchange"}) {
    EXPECT_TRUE(
        access.Check(Peer(true, "pipetrain-worker-2"), method, "").ok());
    EXPECT_TRUE(
        access.Check(Peer(true, "pipetrain-scheduler"), method, "").ok());
    const absl::Status stranger =
        access.Check(Peer(false, "10.0.0.9"), method, "");
    EXPECT_EQ(stranger.code(), absl::StatusCode::kPermissionDenied) << method;
    EXPECT_NE(stranger.message().find("only a peer of this cluster"),
              std::string::npos)
        << stranger;
  }
  // The same worker may not configure the stage or stream into it.
  EXPECT_EQ(
      access.Check(Peer(true, "pipetrain-worker-2"), "Configure", "").code(),
      absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(access
                .Check(Peer(true, "pipetrain-worker-2"), "Exchange",
                       "pipetrain-worker-1")
                .code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(StageAccessTest, OpenOnPlaintextLoopback) {
  const StageAccess access;
  EXPECT_TRUE(access.Check(Peer(false, "127.0.0.1"), "Probe", "").ok());
  EXPECT_EQ(access.Check(Peer(false, "127.0.0.1"), "NoSuchMethod", "").code(),
            absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace pipetrain
