// A worker id belongs to the identity that registered it: re-registrations
// and heartbeats from anyone else are refused.
#include "scheduler/worker_registry.h"

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

v1::WorkerInfo Info(const std::string& id = "") {
  v1::WorkerInfo info;
  info.set_id(id);
  info.set_address("10.0.0.7:7100");
  return info;
}

WorkerAdmission From(const std::string& identity, const std::string& secret,
                     const std::string& presented = "") {
  WorkerAdmission a;
  a.identity = identity;
  a.new_secret = secret;
  a.presented_secret = presented;
  return a;
}

TEST(WorkerRegistryAdmissionTest, BindsTheIdToItsIdentityAndSecret) {
  WorkerRegistry registry(RegistryOptions(), nullptr);
  auto r = registry.Register(Info(), 0, From("worker-a", "sa"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->worker_secret(), "sa");
  EXPECT_EQ(registry.Get(r->worker_id())->identity(), "worker-a");

  EXPECT_TRUE(registry.CheckCaller(r->worker_id(), "worker-a", "sa").ok());
  EXPECT_EQ(registry.CheckCaller(r->worker_id(), "mallory", "sa").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(registry.CheckCaller(r->worker_id(), "worker-a", "guess").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(registry.CheckCaller(r->worker_id(), "worker-a", "").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(registry.CheckCaller("w-99", "worker-a", "sa").code(),
            absl::StatusCode::kNotFound);
}

TEST(WorkerRegistryAdmissionTest, AnotherIdentityCannotTakeOverAnId) {
  WorkerRegistry registry(RegistryOptions(), nullptr);
  auto a = registry.Register(Info(), 0, From("worker-a", "sa"));
  ASSERT_TRUE(a.ok());
  v1::WorkerInfo hijack = Info(a->worker_id());
  hijack.set_address("10.6.6.6:7100");
  auto taken = registry.Register(hijack, 1, From("mallory", "sm", "sa"));
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kPermissionDenied);
  // Same identity without the secret (plaintext: the host alone proves
  // nothing) is refused too.
  auto no_secret = registry.Register(hijack, 1, From("worker-a", "sm", ""));
  EXPECT_EQ(no_secret.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(registry.Get(a->worker_id())->address(), "10.0.0.7:7100");
  EXPECT_TRUE(registry.CheckCaller(a->worker_id(), "worker-a", "sa").ok());
}

TEST(WorkerRegistryAdmissionTest, TheOwnerReRegistersWithItsSecretOrCert) {
  WorkerRegistry registry(RegistryOptions(), nullptr);
  auto a = registry.Register(Info(), 0, From("worker-a", "s1"));
  ASSERT_TRUE(a.ok());
  auto again =
      registry.Register(Info(a->worker_id()), 1, From("worker-a", "s2", "s1"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->worker_id(), a->worker_id());
  EXPECT_EQ(registry.CheckCaller(a->worker_id(), "worker-a", "s1").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(registry.CheckCaller(a->worker_id(), "worker-a", "s2").ok());
  // A restarted worker process has lost its secret; its certificate
  // proves it.
  WorkerAdmission by_cert = From("worker-a", "s3");
  by_cert.identity_verified = true;
  EXPECT_TRUE(registry.Register(Info(a->worker_id()), 2, by_cert).ok());
}

TEST(WorkerRegistryAdmissionTest, FreshIdsSkipIdsWorkersChose) {
  WorkerRegistry registry(RegistryOptions(), nullptr);
  ASSERT_TRUE(registry.Register(Info("w-1"), 0, From("chooser", "s")).ok());
  auto fresh = registry.Register(Info(), 0, From("other", "t"));
  ASSERT_TRUE(fresh.ok());
  EXPECT_NE(fresh->worker_id(), "w-1");
  EXPECT_EQ(registry.Get("w-1")->identity(), "chooser");
}

TEST(WorkerRegistryAdmissionTest, RestoredWorkersAreKnownByTheirIdentity) {
  WorkerRegistry registry(RegistryOptions(), nullptr);
  v1::WorkerInfo persisted = Info("w-4");
  persisted.set_identity("worker-a");
  registry.Load({persisted}, 0);
  // Its secret died with the last scheduler: the identity decides, and the
  // first heartbeat's secret is bound from then on.
  EXPECT_EQ(registry.CheckCaller("w-4", "mallory", "m").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(registry.CheckCaller("w-4", "worker-a", "old").ok());
  EXPECT_EQ(registry.CheckCaller("w-4", "worker-a", "other").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(registry.Register(Info("w-4"), 1, From("mallory", "m", "old"))
                .status()
                .code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(
      registry.Register(Info("w-4"), 1, From("worker-a", "new", "old")).ok());
  EXPECT_TRUE(registry.CheckCaller("w-4", "worker-a", "new").ok());
}

}  // namespace
}  // namespace pipetrain
