// The network lab: hosts that are network namespaces joined by emulated
// links (pipetrain-link-emulator, link_model.h), and pipetrain processes
// started inside them. Needs root, /dev/net/tun and iproute2's `ip netns`;
// traffic goes only between the lab's own addresses.
//
// Every name the lab creates (namespaces, devices, CPU cgroups) starts with
// "pt<pid>l<n>", so parallel runs never collide; all of it is removed when
// the lab is destroyed, and what a killed run left behind is removed by the
// next lab created on the machine.
#ifndef PIPETRAIN_TESTS_NETLAB_NETLAB_H_
#define PIPETRAIN_TESTS_NETLAB_NETLAB_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/cluster_harness.h"
#include "tests/netlab/link_model.h"

namespace pipetrain::netlab {

// OK when this process can build a lab (root, /dev/net/tun, `ip netns`);
// FailedPrecondition saying what is missing otherwise.
absl::Status CheckLabPrerequisites();
// PIPETRAIN_SKIP_NETNS=1: tests and benchmarks skip (and say so) instead of
// failing where the lab cannot be built.
bool SkipRequested();

struct LabOptions {
  // Host names (letters and digits, at most 8); each gets a namespace and
  // an address. The process that creates the lab is one more host,
  // kControllerHost, joined to every host by unlimited links.
  std::vector<std::string> hosts;
  // Links between hosts without an entry in `links`.
  LinkParams default_link;
  // One direction each: (source host, destination host).
  std::map<std::pair<std::string, std::string>, LinkParams> links;
  uint64_t seed = 1;
};

inline constexpr char kControllerHost[] = "ctl";

// Not thread-safe. Destroy the processes started in it first (the lab's
// destructor removes cgroups only once their processes are gone).
class NetLab {
 public:
  static absl::StatusOr<std::unique_ptr<NetLab>> Create(
      const LabOptions& options);
  ~NetLab();
  NetLab(const NetLab&) = delete;
  NetLab& operator=(const NetLab&) = delete;

  // The host's IPv4 address (kControllerHost: this process's).
  std::string Address(const std::string& host) const;
  std::string Namespace(const std::string& host) const;

  // Starts `binary` with `args` inside `host`'s namespace (ChildProcess:
  // it writes a port file, and is killed when destroyed); in `cgroup`
  // (from CpuCgroup) from its first instruction when one is given, with
  // the cgroup v1 cpu hierarchy mounted at /sys/fs/cgroup/cpu in its own
  // mount namespace, as a container sees its CPU limit.
  absl::StatusOr<std::unique_ptr<testing::ChildProcess>> Start(
      const std::string& host, const std::string& binary,
      const std::vector<std::string>& args, const std::string& cgroup = "",
      double timeout_s = 60) const;
  // Runs a shell-free command inside `host`'s namespace; its stdout.
  absl::StatusOr<std::string> Run(const std::string& host,
                                  const std::vector<std::string>& argv) const;

  // A cgroup v1 CPU group capped at `cpu_share` of one core (a CFS
  // quota); its directory, for Start.
  absl::StatusOr<std::string> CpuCgroup(double cpu_share);

  // Every link's counters so far, by (source host, destination host); links
  // that carried nothing are absent.
  absl::StatusOr<std::map<std::pair<std::string, std::string>, LinkCounters>>
  Counters();

  // Stops the emulator and returns its per-link counters (one line each).
  std::string StopEmulator();

 private:
  NetLab() = default;
  absl::Status Build(const LabOptions& options);

  std::string prefix_;                             // "pt<pid>l<n>"
  std::map<std::string, std::string> address_;     // host -> address
  std::map<std::string, std::string> namespaces_;  // host -> netns
  std::vector<std::string> cgroups_;
  pid_t emulator_pid_ = -1;
  testing::TempDir dir_;  // the emulator's log
  std::string emulator_log_;
  std::string counters_;
};

// The path of the `ip` binary (iproute2).
std::string IpBinary();

}  // namespace pipetrain::netlab

#endif  // PIPETRAIN_TESTS_NETLAB_NETLAB_H_
