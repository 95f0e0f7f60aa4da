#include "common/cpu_quota.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace pipetrain {
namespace {

// Where a cgroup hierarchy is mounted and which of its paths the mount
// shows (a container sees its own cgroup as the mount's root).
struct Mount {
  std::string root;
  std::string point;
};

// /proc/self/mountinfo: "id parent maj:min root point options [optional
// fields] - fstype source super-options". The hierarchy of cgroup v1's cpu
// controller (`v1` true) or the cgroup v2 one.
std::optional<Mount> FindCgroupMount(absl::string_view mountinfo, bool v1) {
  for (absl::string_view line : absl::StrSplit(mountinfo, '\n')) {
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    auto dash = std::find(fields.begin(), fields.end(), "-");
    if (fields.size() < 5 || dash == fields.end() || fields.end() - dash < 4) {
      continue;
    }
    const absl::string_view type = dash[1];
    if (v1) {
      if (type != "cgroup") continue;
      std::vector<absl::string_view> options = absl::StrSplit(dash[3], ',');
      if (std::find(options.begin(), options.end(), "cpu") == options.end()) {
        continue;
      }
    } else if (type != "cgroup2") {
      continue;
    }
    return Mount{std::string(fields[3]), std::string(fields[4])};
  }
  return std::nullopt;
}

// /proc/self/cgroup: "id:controllers:path"; v1's line lists cpu among its
// controllers, v2's is "0::path".
std::optional<std::string> FindCgroupPath(absl::string_view self_cgroup,
                                          bool v1) {
  for (absl::string_view line : absl::StrSplit(self_cgroup, '\n')) {
    std::vector<absl::string_view> parts = absl::StrSplit(line, ':');
    if (parts.size() < 3) continue;
    // The path may itself hold ':'.
    const size_t path_at = parts[0].size() + parts[1].size() + 2;
    const std::string path(line.substr(path_at));
    if (v1) {
      std::vector<absl::string_view> controllers =
          absl::StrSplit(parts[1], ',');
      if (std::find(controllers.begin(), controllers.end(), "cpu") !=
          controllers.end()) {
        return path;
      }
    } else if (parts[0] == "0" && parts[1].empty()) {
      return path;
    }
  }
  return std::nullopt;
}

std::optional<int64_t> ParseInt(absl::string_view text) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &value)) {
    return std::nullopt;
  }
  return value;
}

// The limit set in directory `dir` of the hierarchy, if any.
std::optional<double> LimitIn(const std::string& dir, bool v1,
                              const FileReader& read) {
  std::optional<int64_t> quota;
  std::optional<int64_t> period;
  if (v1) {
    std::optional<std::string> q = read(dir + "/cpu.cfs_quota_us");
    std::optional<std::string> p = read(dir + "/cpu.cfs_period_us");
    if (!q || !p) return std::nullopt;
    quota = ParseInt(*q);
    period = ParseInt(*p);
  } else {
    // "max 100000" (no limit) or "50000 100000".
    std::optional<std::string> max = read(dir + "/cpu.max");
    if (!max) return std::nullopt;
    std::vector<absl::string_view> parts =
        absl::StrSplit(absl::StripAsciiWhitespace(*max), ' ');
    if (parts.size() != 2) return std::nullopt;
    quota = ParseInt(parts[0]);
    period = ParseInt(parts[1]);
  }
  if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;
  return static_cast<double>(*quota) / static_cast<double>(*period);
}

std::optional<double> LimitOnPath(absl::string_view mountinfo,
                                  absl::string_view self_cgroup, bool v1,
                                  const FileReader& read) {
  std::optional<Mount> mount = FindCgroupMount(mountinfo, v1);
  std::optional<std::string> path = FindCgroupPath(self_cgroup, v1);
  if (!mount || !path) return std::nullopt;
  // The part of the path below what the mount shows; a path outside it
  // (another namespace's view) leaves only the mount's root to read.
  std::string relative;
  if (mount->root == "/") {
    relative = *path;
  } else if (absl::StartsWith(*path, mount->root) &&
             (path->size() == mount->root.size() ||
              (*path)[mount->root.size()] == '/')) {
    relative = path->substr(mount->root.size());
  }
  std::string point = mount->point;
  while (!point.empty() && point.back() == '/') point.pop_back();
  std::string dir = point + relative;
  while (dir.size() > point.size() && dir.back() == '/') dir.pop_back();
  std::optional<double> lowest;
  while (true) {
    if (std::optional<double> limit = LimitIn(dir, v1, read)) {
      lowest = lowest ? std::min(*lowest, *limit) : *limit;
    }
    if (dir.size() <= point.size()) break;
    const size_t slash = dir.find_last_of('/');
    if (slash == std::string::npos || slash < point.size()) {
      dir = point;
    } else {
      dir.resize(std::max(slash, point.size()));
    }
  }
  return lowest;
}

std::optional<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return text.str();
}

}  // namespace

std::optional<double> CgroupCpuLimitFrom(absl::string_view mountinfo,
                                         absl::string_view self_cgroup,
                                         const FileReader& read) {
  // On a hybrid host the cpu controller sits in a v1 hierarchy and the v2
  // one holds no cpu.max: v1 first.
  if (FindCgroupMount(mountinfo, /*v1=*/true) &&
      FindCgroupPath(self_cgroup, /*v1=*/true)) {
    return LimitOnPath(mountinfo, self_cgroup, /*v1=*/true, read);
  }
  return LimitOnPath(mountinfo, self_cgroup, /*v1=*/false, read);
}

std::optional<double> CgroupCpuLimit() {
  std::optional<std::string> mountinfo = ReadWholeFile("/proc/self/mountinfo");
  std::optional<std::string> self_cgroup = ReadWholeFile("/proc/self/cgroup");
  if (!mountinfo || !self_cgroup) return std::nullopt;
  return CgroupCpuLimitFrom(*mountinfo, *self_cgroup, ReadWholeFile);
}

double CpuShareOf(std::optional<double> limit, int threads) {
  if (!limit || !(*limit > 0) || threads < 1) return 1.0;
  return std::min(1.0, *limit / threads);
}

}  // namespace pipetrain
