// Test data for the checkpoint store's tests: a layer's state whose every
// value is a function of (version, layer), so a loaded checkpoint can be
// checked against an independent recomputation. Test-only.
#ifndef PIPETRAIN_SCHEDULER_CHECKPOINT_TEST_UTIL_H_
#define PIPETRAIN_SCHEDULER_CHECKPOINT_TEST_UTIL_H_

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "scheduler/state_tensor.h"

namespace pipetrain {

inline std::string TestFloats(int64_t count, float base) {
  std::vector<float> v(static_cast<size_t>(count));
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = base + 0.25f * static_cast<float>(i % 1024);
  }
  std::string out(v.size() * sizeof(float), '\0');
  std::memcpy(out.data(), v.data(), out.size());  // little-endian host
  return out;
}

// Layer `layer`'s parameters and SGD momentum at `version`; `width` sets
// the size (the weight is [width, width / 2]).
inline std::vector<StateTensor> TestLayerState(int64_t version, int layer,
                                               int64_t width = 4) {
  const float base = static_cast<float>(version * 100 + layer);
  const std::string prefix = absl::StrCat("layers.", layer, ".");
  const std::vector<int64_t> w_shape = {width, width / 2};
  return {
      {prefix + "weight", w_shape, TestFloats(width * (width / 2), base)},
      {prefix + "bias", {width}, TestFloats(width, -base)},
      {absl::StrCat("optimizer.", prefix, "weight.momentum"), w_shape,
       TestFloats(width * (width / 2), base + 0.5f)},
  };
}

inline constexpr char kTestSpecJson[] =
    R"({"name":"mlp-job","model":{"name":"mlp","inputShape":["4"]},)"
    R"("batchSize":"8"})";

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_CHECKPOINT_TEST_UTIL_H_
