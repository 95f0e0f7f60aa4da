// Seconds elapsed on the steady clock, and the process's CPU time.
#ifndef PIPETRAIN_COMMON_ELAPSED_H_
#define PIPETRAIN_COMMON_ELAPSED_H_

#include <time.h>

#include <chrono>

namespace pipetrain {

// Seconds from `start` to now, on the steady clock.
inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

// This process's CPU time so far, all threads (user + system), in seconds.
inline double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) +
         1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_ELAPSED_H_
