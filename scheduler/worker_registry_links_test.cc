// The registry's link matrix: which links a worker is asked to measure
// (new peers, stale measurements, not while a stage runs unless a planner
// asks, not again until the retry period when unanswered), what it stores,
// and that the zone overrides win over measurements where they apply.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler/plan_builder.h"
#include "scheduler/worker_registry.h"

namespace pipetrain {
namespace {

constexpr int64_t kSecond = 1000;

std::vector<std::string> Ids(const std::vector<v1::ProbeTarget>& targets) {
  std::vector<std::string> out;
  for (const v1::ProbeTarget& t : targets) out.push_back(t.worker_id());
  return out;
}

google::protobuf::RepeatedPtrField<v1::LinkMeasurement> Link(
    const std::string& to, double bandwidth, double rtt) {
  google::protobuf::RepeatedPtrField<v1::LinkMeasurement> links;
  v1::LinkMeasurement* l = links.Add();
  l->set_to_worker_id(to);
  l->set_bandwidth_bytes_per_s(bandwidth);
  l->set_rtt_seconds(rtt);
  l->set_source("probe");
  return links;
}

class RegistryLinksTest : public ::testing::Test {
 protected:
  RegistryLinksTest() : registry_(Options(), nullptr) {
    for (int i = 1; i <= 3; ++i) {
      v1::WorkerInfo info;
      info.set_address("10.0.0." + std::to_string(i) + ":7100");
      WorkerAdmission admission;
      admission.identity = "worker-" + std::to_string(i);
      auto r = registry_.Register(info, 0, admission);
      EXPECT_TRUE(r.ok()) << r.status();
      registry_.Heartbeat(r->worker_id(), 0);  // IDLE
    }
  }
  static RegistryOptions Options() {
    RegistryOptions options;
    options.lease_seconds = 1e6;
    options.link_refresh_seconds = 600;
    options.probe_retry_seconds = 10;
    return options;
  }
  WorkerRegistry registry_;
};

TEST_F(RegistryLinksTest, NewWorkersAreAskedToMeasureEveryPeerOnce) {
  const std::vector<v1::ProbeTarget> first = registry_.ProbesFor("w-1", 0);
  EXPECT_EQ(Ids(first), (std::vector<std::string>{"w-2", "w-3"}));
  EXPECT_EQ(first[0].address(), "10.0.0.2:7100");
  EXPECT_EQ(first[0].identity(), "worker-2");
  // Unanswered: not asked again until the retry period has passed.
  EXPECT_TRUE(registry_.ProbesFor("w-1", 5 * kSecond).empty());
  // Meanwhile w-2 is being measured: it measures nothing itself.
  EXPECT_TRUE(registry_.ProbesFor("w-2", 5 * kSecond).empty());
  EXPECT_EQ(Ids(registry_.ProbesFor("w-1", 11 * kSecond)),
            (std::vector<std::string>{"w-2", "w-3"}));
  // Once w-1 reported, the peers measure their links to it (and the rest).
  registry_.RecordLinks("w-1", Link("w-2", 1e9, 0.001), 12 * kSecond);
  registry_.RecordLinks("w-1", Link("w-3", 1e9, 0.001), 12 * kSecond);
  EXPECT_EQ(Ids(registry_.ProbesFor("w-2", 12 * kSecond)),
            (std::vector<std::string>{"w-1", "w-3"}));
}

TEST_F(RegistryLinksTest, StoresMeasurementsAndReprobesThemWhenStale) {
  registry_.ProbesFor("w-1", 0);
  registry_.RecordLinks("w-1", Link("w-2", 1.2e9, 0.0004), 2 * kSecond);
  const v1::WorkerInfo w1 = *registry_.Get("w-1");
  ASSERT_EQ(w1.links_size(), 1);
  EXPECT_EQ(w1.links(0).to_worker_id(), "w-2");
  EXPECT_EQ(w1.links(0).bandwidth_bytes_per_s(), 1.2e9);
  EXPECT_EQ(w1.links(0).rtt_seconds(), 0.0004);
  EXPECT_EQ(w1.links(0).source(), "probe");
  EXPECT_EQ(w1.links(0).measured_unix_ms(), 2 * kSecond);
  // Measured: only w-3 is still due (once its retry period passed).
  EXPECT_EQ(Ids(registry_.ProbesFor("w-1", 20 * kSecond)),
            (std::vector<std::string>{"w-3"}));
  EXPECT_EQ(registry_.MissingLinks({"w-1", "w-2"}, 20 * kSecond), 1);
  // A newer measurement replaces it.
  registry_.RecordLinks("w-1", Link("w-2", 2e9, 0.0003), 30 * kSecond);
  EXPECT_EQ(registry_.Get("w-1")->links_size(), 1);
  EXPECT_EQ(registry_.Get("w-1")->links(0).bandwidth_bytes_per_s(), 2e9);
  // Past the refresh period it is measured again.
  const int64_t later = 30 * kSecond + 601 * kSecond;
  EXPECT_EQ(Ids(registry_.ProbesFor("w-1", later)),
            (std::vector<std::string>{"w-2", "w-3"}));
  // Measurements to unknown workers or without a bandwidth are dropped.
  registry_.RecordLinks("w-1", Link("w-9", 1e9, 0.001), later);
  registry_.RecordLinks("w-1", Link("w-3", 0, 0.001), later);
  EXPECT_EQ(registry_.Get("w-1")->links_size(), 1);
}

TEST_F(RegistryLinksTest, BusyWorkersAreLeftAloneUnlessAPlannerAsks) {
  ASSERT_TRUE(registry_.Assign("w-2", "job-1", 0).ok());
  // Neither w-2 nor its peers probe it while its stage runs.
  EXPECT_TRUE(registry_.ProbesFor("w-2", 0).empty());
  EXPECT_EQ(Ids(registry_.ProbesFor("w-1", 0)),
            (std::vector<std::string>{"w-3"}));
  registry_.RecordLinks("w-1", Link("w-3", 1e9, 0.001), kSecond / 2);
  // A re-plan that needs the links asks for them anyway, at once, one
  // measurement per worker at a time.
  EXPECT_EQ(registry_.WantProbes({"w-1", "w-2"}, kSecond), 2);
  EXPECT_EQ(Ids(registry_.ProbesFor("w-2", kSecond)),
            (std::vector<std::string>{"w-1"}));
  EXPECT_TRUE(registry_.ProbesFor("w-1", kSecond).empty());
  registry_.RecordLinks("w-2", Link("w-1", 1e9, 0.001), 2 * kSecond);
  EXPECT_EQ(Ids(registry_.ProbesFor("w-1", 2 * kSecond)),
            (std::vector<std::string>{"w-2"}));
  registry_.RecordLinks("w-1", Link("w-2", 1e9, 0.001), 3 * kSecond);
  EXPECT_EQ(registry_.MissingLinks({"w-1", "w-2"}, 3 * kSecond), 0);
}

TEST_F(RegistryLinksTest, AForgottenWorkerLeavesNoLinks) {
  registry_.RecordLinks("w-1", Link("w-3", 1e9, 0.001), kSecond);
  ASSERT_TRUE(registry_.Remove("w-3").ok());
  EXPECT_EQ(registry_.Get("w-1")->links_size(), 0);
  EXPECT_EQ(Ids(registry_.ProbesFor("w-1", 20 * kSecond)),
            (std::vector<std::string>{"w-2"}));
}

TEST(LinkOverridesTest, ZoneOverridesReplaceMeasurementsInTheListing) {
  std::vector<v1::WorkerInfo> workers(3);
  const char* zones[] = {"a", "a", "b"};
  for (int i = 0; i < 3; ++i) {
    workers[i].set_id("w-" + std::to_string(i + 1));
    (*workers[i].mutable_labels())["zone"] = zones[i];
  }
  *workers[0].mutable_links() = Link("w-2", 1e9, 0.001);  // a-a: kept
  *workers[1].mutable_links() = Link("w-3", 1e9, 0.001);  // a-b: overridden
  Topology topology;
  topology.bandwidth[{"a", "b"}] = 1e7;
  topology.rtt[{"b", "a"}] = 0.05;
  ApplyLinkOverrides(topology, &workers);
  ASSERT_EQ(workers[0].links_size(), 2);
  EXPECT_EQ(workers[0].links(0).source(), "probe");
  EXPECT_EQ(workers[0].links(0).bandwidth_bytes_per_s(), 1e9);
  EXPECT_EQ(workers[0].links(1).to_worker_id(), "w-3");  // not measured
  EXPECT_EQ(workers[0].links(1).source(), "override");
  EXPECT_EQ(workers[0].links(1).bandwidth_bytes_per_s(), 1e7);
  EXPECT_EQ(workers[0].links(1).rtt_seconds(), 0.05);
  // w-2 -> w-1 (a-a) is neither measured nor overridden: absent.
  ASSERT_EQ(workers[1].links_size(), 1);
  EXPECT_EQ(workers[1].links(0).source(), "override");
  EXPECT_EQ(workers[1].links(0).bandwidth_bytes_per_s(), 1e7);
  EXPECT_EQ(workers[1].links(0).rtt_seconds(), 0.05);
  EXPECT_EQ(workers[2].links_size(), 2);  // b -> a, both overridden
}

}  // namespace
}  // namespace pipetrain
