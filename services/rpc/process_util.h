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
