// A job that cannot fit the workers' memory together is refused before any
// worker profiles it, with the numbers.
#include "scheduler/memory_check.h"

#include "absl/strings/str_cat.h"
#include "common/proto_json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

v1::TrainingSpec Spec() {
  v1::TrainingSpec spec;
  const absl::Status parsed = ParseJson(R"({
    "model": {"inputKind": "INPUT_KIND_FLOAT", "inputShape": [1000],
      "loss": "LOSS_KIND_SOFTMAX_CROSS_ENTROPY",
      "layers": [{"linear": {"inFeatures": 1000, "outFeatures": 1000}}]},
    "optimizer": {"sgd": {"lr": 0.1}}, "batchSize": 10, "steps": 1})",
                                        &spec);
  EXPECT_TRUE(parsed.ok()) << parsed;
  return spec;
}

v1::WorkerInfo Worker(int64_t memory) {
  v1::WorkerInfo w;
  w.set_memory_bytes(memory);
  return w;
}

TEST(MemoryCheck, RefusesAJobLargerThanTheWorkersTogether) {
  // 1001000 parameters and gradients plus 10 x 1000 floats, 4 bytes each.
  const int64_t need = 4 * (2 * 1001000 + 10 * 1000);
  EXPECT_TRUE(
      CheckJobFitsWorkers(Spec(), {Worker(need / 2), Worker(need / 2)}).ok());
  const absl::Status status =
      CheckJobFitsWorkers(Spec(), {Worker(need / 4), Worker(need / 4)});
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat(need, " bytes")));
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat(need / 2, " bytes")));
  // A worker that does not say leaves the decision to the planner.
  EXPECT_TRUE(CheckJobFitsWorkers(Spec(), {Worker(1), Worker(0)}).ok());
}

}  // namespace
}  // namespace pipetrain
