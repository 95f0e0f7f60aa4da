#include "scheduler/worker_kinds.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::WorkerInfo Worker(const std::string& id, const std::string& device,
                      double gflops) {
  v1::WorkerInfo w;
  w.set_id(id);
  w.set_device_kind("cpu");
  w.set_device(device);
  w.set_gemm_gflops(gflops);
  return w;
}

// `layers` layers of `forward` and twice that backward.
v1::ProfileResponse Profile(int layers, double forward) {
  v1::ProfileResponse p;
  for (int l = 0; l < layers; ++l) {
    v1::LayerProfile* layer = p.add_layers();
    layer->set_forward_seconds(forward);
    layer->set_backward_seconds(2 * forward);
  }
  return p;
}

TEST(WorkerKindsTest, OneKindIsOneDeviceWithinTheGemmSpread) {
  const v1::WorkerInfo a = Worker("a", "cpu (openblas, 1 threads)", 10);
  EXPECT_TRUE(SameWorkerKind(a, Worker("b", "cpu (openblas, 1 threads)", 14)));
  EXPECT_TRUE(SameWorkerKind(a, Worker("b", "cpu (openblas, 1 threads)", 7)));
  EXPECT_FALSE(SameWorkerKind(a, Worker("b", "cpu (openblas, 1 threads)", 16)));
  EXPECT_FALSE(SameWorkerKind(a, Worker("b", "cpu (openblas, 2 threads)", 10)));
  v1::WorkerInfo gpu = Worker("g", "cpu (openblas, 1 threads)", 10);
  gpu.set_device_kind("cuda");
  EXPECT_FALSE(SameWorkerKind(a, gpu));
  // A speed nobody measured matches only another unmeasured one.
  EXPECT_FALSE(SameWorkerKind(a, Worker("b", "cpu (openblas, 1 threads)", 0)));
  EXPECT_TRUE(SameWorkerKind(Worker("a", "x", 0), Worker("b", "x", 0)));
}

TEST(WorkerKindsTest, KindsInOrderOfFirstAppearance) {
  const std::vector<v1::WorkerInfo> workers = {
      Worker("a", "cpu", 10), Worker("b", "cpu", 40), Worker("c", "cpu", 12),
      Worker("d", "gpu", 10), Worker("e", "cpu", 35)};
  EXPECT_THAT(
      GroupWorkerKinds(workers),
      ElementsAre(ElementsAre(0, 2), ElementsAre(1, 4), ElementsAre(3)));
  EXPECT_TRUE(GroupWorkerKinds({}).empty());
}

TEST(WorkerKindsTest, OneKindRunsAtOneSpeedWhateverItsGemmNoise) {
  const std::vector<v1::WorkerInfo> workers = {
      Worker("a", "cpu", 10), Worker("b", "cpu", 14), Worker("c", "cpu", 8)};
  const WorkerSpeeds speeds = SpeedsByKind(workers, Profile(3, 0.001), {});
  EXPECT_THAT(speeds.speed, ElementsAre(1.0, 1.0, 1.0));
  EXPECT_THAT(speeds.explanation, HasSubstr("kind 1: cpu x3 (a, b, c)"));
  EXPECT_THAT(speeds.explanation, HasSubstr("reference, profiled on a"));
}

TEST(WorkerKindsTest, AProfiledKindSpeedsByItsProfileNotItsGemm) {
  // b's GEMM is four times a's, but the model runs half as fast on it (its
  // own profile): the profile decides. d was not profiled: GEMM ratio.
  const std::vector<v1::WorkerInfo> workers = {
      Worker("a", "cpu", 10), Worker("b", "gpu", 40), Worker("c", "gpu", 44),
      Worker("d", "cpu", 30)};
  const std::map<std::string, v1::ProfileResponse> profiles = {
      {"c", Profile(3, 0.002)}};
  const WorkerSpeeds speeds =
      SpeedsByKind(workers, Profile(3, 0.001), profiles);
  ASSERT_EQ(speeds.speed.size(), 4u);
  EXPECT_DOUBLE_EQ(speeds.speed[0], 1.0);
  EXPECT_DOUBLE_EQ(speeds.speed[1], 0.5);
  EXPECT_DOUBLE_EQ(speeds.speed[2], 0.5);
  EXPECT_DOUBLE_EQ(speeds.speed[3], 3.0);
  EXPECT_THAT(speeds.explanation,
              HasSubstr("kind 2: gpu x2 (b, c): speed 0.5, profiled on c"));
  EXPECT_THAT(speeds.explanation,
              HasSubstr("kind 3: cpu x1 (d): speed 3, GEMM 30.0 vs 10.0 "
                        "GFLOP/s (not profiled)"));
  // An empty profile (nothing measured) is no evidence: GEMM ratio.
  const WorkerSpeeds empty =
      SpeedsByKind(workers, Profile(3, 0.001), {{"b", v1::ProfileResponse()}});
  EXPECT_DOUBLE_EQ(empty.speed[1], 4.0);
}

}  // namespace
}  // namespace pipetrain
