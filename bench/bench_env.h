// The benchmarks' knobs from the environment. A knob that is unset or empty
// takes its default; one set to anything but a positive number stops the
// bench with a message naming it (exit status 2), rather than running a
// configuration nobody asked for.
#ifndef PIPETRAIN_BENCH_BENCH_ENV_H_
#define PIPETRAIN_BENCH_BENCH_ENV_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/numbers.h"

namespace pipetrain {

[[noreturn]] inline void RefuseEnvKnob(const char* name, const char* value,
                                       const char* want) {
  std::fprintf(stderr, "%s=%s: not %s\n", name, value, want);
  std::exit(2);
}

// The positive integer `name` holds, else `fallback` when it is unset.
inline int64_t PositiveEnvInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  int64_t out = 0;
  if (!absl::SimpleAtoi(v, &out) || out < 1) {
    RefuseEnvKnob(name, v, "a positive integer");
  }
  return out;
}

// The positive number `name` holds, else `fallback` when it is unset.
inline double PositiveEnvDouble(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  double out = 0;
  if (!absl::SimpleAtod(v, &out) || !(out > 0)) {
    RefuseEnvKnob(name, v, "a positive number");
  }
  return out;
}

}  // namespace pipetrain

#endif  // PIPETRAIN_BENCH_BENCH_ENV_H_
