// Small helpers shared by the binaries' main(): waiting for a shutdown
// signal and publishing the ports a process bound.
#ifndef PIPETRAIN_SERVICES_RPC_PROCESS_UTIL_H_
#define PIPETRAIN_SERVICES_RPC_PROCESS_UTIL_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace pipetrain {

// Blocks SIGINT and SIGTERM in the calling thread and every thread it
// starts later. Call first in main(), before any thread exists.
void BlockShutdownSignals();
// Waits for SIGINT or SIGTERM (blocked by BlockShutdownSignals); returns it.
int WaitForShutdownSignal();

// In a release build (NDEBUG), stops absl::Mutex from recording every lock
// order in its process-wide graph to look for deadlock cycles, which it
// does unless the absl library itself was built with NDEBUG (Debian's is
// not): under perf, a make demo worker spent 1.1% of its CPU samples in
// absl's cycle graph and 3.7% in its Mutex code with the check, 0% and
// 2.2% without. Debug builds keep the check. Call early in main().
void SkipMutexCycleChecksInReleaseBuilds();

// Writes "name=value" lines to `path` atomically (temp file + rename), so a
// reader never sees a partial file. No-op for an empty path.
absl::Status WritePortFile(
    const std::string& path,
    const std::vector<std::pair<std::string, int>>& ports);

// Splits "host:port"; InvalidArgument when malformed.
absl::Status SplitHostPort(const std::string& address, std::string* host,
                           int* port);

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_RPC_PROCESS_UTIL_H_
