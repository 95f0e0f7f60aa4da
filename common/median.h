// The median of a set of measurements (the middle one, or the mean of the
// two middle ones), 0 for none: how the project summarizes repeated
// timings (probe round trips, step times, per-message overheads).
#ifndef PIPETRAIN_COMMON_MEDIAN_H_
#define PIPETRAIN_COMMON_MEDIAN_H_

#include <algorithm>
#include <vector>

namespace pipetrain {

inline double Median(std::vector<double> xs) {
  if (xs.empty()) return 0.0;
  std::sort(xs.begin(), xs.end());
  const size_t n = xs.size();
  return n % 2 == 1 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
}

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_MEDIAN_H_
