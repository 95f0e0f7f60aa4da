// The link emulator between two namespaces: the round trip and the TCP
// throughput it gives match the configured link (loosely: a loaded
// 2-core machine adds delay and takes rate, but an emulator that did not
// apply the delay or the rate fails), loss is applied at the configured
// rate, and the devices vanish with the emulator.
#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/netlab/netlab.h"
#include "tests/netlab/require_lab.h"
#include "tests/netlab/wan_cluster.h"

namespace pipetrain::netlab {
namespace {

LinkParams Link(double mbit, double delay_ms, double loss = 0) {
  LinkParams p;
  p.rate_bits_per_s = mbit * 1e6;
  p.delay_s = delay_ms * 1e-3;
  p.loss = loss;
  return p;
}

LabOptions TwoHosts(const LinkParams& link) {
  LabOptions options;
  options.hosts = {"a", "b"};
  options.default_link = Link(0, 0);
  options.links[{"a", "b"}] = link;
  options.links[{"b", "a"}] = link;
  return options;
}

// A probe server in `host`; its address.
std::string Serve(NetLab& lab, const std::string& host,
                  std::unique_ptr<testing::ChildProcess>* server) {
  auto started = lab.Start(host, ProbeBinary(),
                           {"serve", "--listen=" + lab.Address(host)});
  EXPECT_TRUE(started.ok()) << started.status();
  if (!started.ok()) return "";
  *server = std::move(*started);
  return absl::StrCat(lab.Address(host), ":", (*server)->port("probe"));
}

double Field(const std::string& text, const std::string& key) {
  const size_t at = text.find(key + "=");
  double v = -1;
  if (at == std::string::npos) return v;
  const size_t start = at + key.size() + 1;
  (void)absl::SimpleAtod(
      text.substr(start, text.find_first_of(" \n", start) - start), &v);
  return v;
}

TEST(LinkEmulatorTest, A100MbitLinkWith20MsEachWayDelaysAndLimitsTcp) {
  PIPETRAIN_REQUIRE_LAB();
  auto lab = NetLab::Create(TwoHosts(Link(100, 20)));
  ASSERT_TRUE(lab.ok()) << lab.status();
  std::unique_ptr<testing::ChildProcess> server;
  const std::string target = Serve(**lab, "b", &server);
  ASSERT_FALSE(target.empty());

  auto rtt =
      (*lab)->Run("a", {ProbeBinary(), "rtt", "--to=" + target, "--count=20"});
  ASSERT_TRUE(rtt.ok()) << rtt.status();
  const double min_ms = Field(*rtt, "rtt_min_ms");
  const double median_ms = Field(*rtt, "rtt_median_ms");
  std::printf("configured RTT 40 ms; measured %s", rtt->c_str());
  EXPECT_GE(min_ms, 40.0);
  EXPECT_LE(median_ms, 40.0 + 30.0);

  // 12 MB: about a second at 100 Mb/s.
  auto sent = (*lab)->Run(
      "a", {ProbeBinary(), "send", "--to=" + target, "--bytes=12000000"});
  ASSERT_TRUE(sent.ok()) << sent.status();
  const double mbit = Field(*sent, "mbit_per_s");
  std::printf("configured 100 Mbit/s; measured %s", sent->c_str());
  // The payload's rate stays below the link's; half of it at least.
  EXPECT_LE(mbit, 100.0);
  EXPECT_GE(mbit, 50.0);
  server.reset();
  std::printf("%s", (*lab)->StopEmulator().c_str());
}

TEST(LinkEmulatorTest, LossIsAppliedAtTheConfiguredRateAndTcpRecovers) {
  PIPETRAIN_REQUIRE_LAB();
  auto lab = NetLab::Create(TwoHosts(Link(1000, 0.1, 0.05)));
  ASSERT_TRUE(lab.ok()) << lab.status();
  std::unique_ptr<testing::ChildProcess> server;
  const std::string target = Serve(**lab, "b", &server);
  ASSERT_FALSE(target.empty());
  auto sent = (*lab)->Run(
      "a", {ProbeBinary(), "send", "--to=" + target, "--bytes=30000000"});
  ASSERT_TRUE(sent.ok()) << sent.status();
  server.reset();
  const std::string counters = (*lab)->StopEmulator();
  std::printf("%s", counters.c_str());
  // "link a -> b: P packets, B bytes delivered, L lost, D dropped ..."
  const size_t at = counters.find("link a -> b: ");
  ASSERT_NE(at, std::string::npos) << counters;
  long long packets = 0, bytes = 0, lost = 0, dropped = 0;
  ASSERT_EQ(std::sscanf(counters.c_str() + at,
                        "link a -> b: %lld packets, %lld bytes delivered, "
                        "%lld lost, %lld dropped",
                        &packets, &bytes, &lost, &dropped),
            4)
      << counters;
  EXPECT_GE(bytes, 30000000);  // everything arrived in the end
  const double rate = double(lost) / double(packets + lost);
  EXPECT_GE(rate, 0.02) << counters;
  EXPECT_LE(rate, 0.10) << counters;
}

TEST(LinkEmulatorTest, DevicesVanishWithTheEmulator) {
  PIPETRAIN_REQUIRE_LAB();
  auto lab = NetLab::Create(TwoHosts(Link(0, 0)));
  ASSERT_TRUE(lab.ok()) << lab.status();
  EXPECT_TRUE((*lab)->Run("a", {IpBinary(), "link", "show", "pttun0"}).ok());
  (*lab)->StopEmulator();
  EXPECT_FALSE((*lab)->Run("a", {IpBinary(), "link", "show", "pttun0"}).ok());
}

}  // namespace
}  // namespace pipetrain::netlab
