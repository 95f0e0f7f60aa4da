// Seconds elapsed on the steady clock.
#ifndef PIPETRAIN_COMMON_ELAPSED_H_
#define PIPETRAIN_COMMON_ELAPSED_H_

#include <chrono>

namespace pipetrain {

// Seconds from `start` to now, on the steady clock.
inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_ELAPSED_H_
