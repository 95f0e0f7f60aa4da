// The CPU a process may keep busy, from its cgroup's CFS bandwidth limit:
// how a container runtime (Docker's --cpus, Kubernetes' limits.cpu) or an
// operator caps a process below the cores it sees. A short measurement (a
// few GEMMs) runs at full speed inside one quota period and does not see
// the cap; a sustained computation gets at most quota / period cores.
#ifndef PIPETRAIN_COMMON_CPU_QUOTA_H_
#define PIPETRAIN_COMMON_CPU_QUOTA_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace pipetrain {

// Reads a whole file; nullopt when it cannot.
using FileReader =
    std::function<std::optional<std::string>(const std::string& path)>;

// The cores this process may use on average (quota / period): the lowest
// limit on the path from its own cgroup up to the root of the hierarchy it
// can see, from cgroup v1's cpu.cfs_quota_us and cpu.cfs_period_us (the
// hierarchy with the cpu controller) or, without one, cgroup v2's cpu.max.
// nullopt when no limit is set or none can be read.
std::optional<double> CgroupCpuLimit();

// The same from the texts of /proc/self/mountinfo and /proc/self/cgroup,
// reading the controllers' files through `read` (tests).
std::optional<double> CgroupCpuLimitFrom(absl::string_view mountinfo,
                                         absl::string_view self_cgroup,
                                         const FileReader& read);

// The share of `threads` threads' full speed that a sustained computation
// gets under `limit` cores: min(1, limit / threads); 1 without a limit.
double CpuShareOf(std::optional<double> limit, int threads);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_CPU_QUOTA_H_
