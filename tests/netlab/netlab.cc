#include "tests/netlab/netlab.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pipetrain::netlab {
namespace {

constexpr char kCpuCgroupRoot[] = "/sys/fs/cgroup/cpu";
constexpr char kNetnsDir[] = "/var/run/netns";

std::string EmulatorBinary() {
  const char* path = std::getenv("PIPETRAIN_LINK_EMULATOR");
  return path != nullptr ? path : PIPETRAIN_DEFAULT_LINK_EMULATOR;
}

// Runs argv (no shell); stdout into `out`. Non-zero exit is an error that
// quotes the command and its stderr.
absl::Status RunCommand(const std::vector<std::string>& argv,
                        std::string* out = nullptr) {
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError("pipe failed");
  }
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    std::vector<char*> args;
    for (const std::string& a : argv) {
      args.push_back(const_cast<char*>(a.c_str()));
    }
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  std::string text[2];
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[4096];
      const ssize_t n = read(fds[i].fd, buf, sizeof(buf));
      if (n > 0) {
        text[i].append(buf, n);
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (out != nullptr) *out = text[0];
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "`", absl::StrJoin(argv, " "), "` failed: ", text[1], text[0]));
  }
  return absl::OkStatus();
}

bool WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  return !out.fail();
}

bool ProcessAlive(pid_t pid) { return kill(pid, 0) == 0 || errno == EPERM; }

// The pid in a name "pt<pid>l...", or -1.
pid_t OwnerPid(const std::string& name) {
  if (name.rfind("pt", 0) != 0) return -1;
  const size_t l = name.find('l', 2);
  int pid = 0;
  if (l == std::string::npos || !absl::SimpleAtoi(name.substr(2, l - 2), &pid))
    return -1;
  return pid;
}

// Moves the processes of cgroup `dir` back to the root group, then removes
// it.
void RemoveCgroup(const std::string& dir) {
  std::ifstream procs(dir + "/cgroup.procs");
  std::string pid;
  while (std::getline(procs, pid)) {
    WriteFile(absl::StrCat(kCpuCgroupRoot, "/cgroup.procs"), pid);
  }
  rmdir(dir.c_str());
}

// What runs that ended without their destructors (a SIGKILLed test) left.
void RemoveLeftovers() {
  for (const char* root : {kNetnsDir, kCpuCgroupRoot}) {
    DIR* dir = opendir(root);
    if (dir == nullptr) continue;
    std::vector<std::string> stale;
    while (dirent* e = readdir(dir)) {
      const pid_t owner = OwnerPid(e->d_name);
      if (owner > 0 && !ProcessAlive(owner)) stale.push_back(e->d_name);
    }
    closedir(dir);
    for (const std::string& name : stale) {
      if (root == std::string(kNetnsDir)) {
        (void)RunCommand({IpBinary(), "netns", "del", name});
      } else {
        RemoveCgroup(absl::StrCat(root, "/", name));
      }
    }
  }
}

}  // namespace

std::string IpBinary() {
  for (const char* path :
       {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "ip";
}

bool SkipRequested() {
  const char* skip = std::getenv("PIPETRAIN_SKIP_NETNS");
  return skip != nullptr && std::string(skip) == "1";
}

absl::Status CheckLabPrerequisites() {
  if (geteuid() != 0) {
    return absl::FailedPreconditionError(
        "the network lab needs root (network namespaces, TUN devices); set "
        "PIPETRAIN_SKIP_NETNS=1 to skip");
  }
  if (access("/dev/net/tun", R_OK | W_OK) != 0) {
    return absl::FailedPreconditionError(
        "the network lab needs /dev/net/tun; set PIPETRAIN_SKIP_NETNS=1 to "
        "skip");
  }
  std::string out;
  absl::Status ip = RunCommand({IpBinary(), "netns", "list"}, &out);
  if (!ip.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the network lab needs iproute2's `ip netns`: ", ip.message(),
        "; set PIPETRAIN_SKIP_NETNS=1 to skip"));
  }
  if (access(EmulatorBinary().c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError("no link emulator at " +
                                         EmulatorBinary());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<NetLab>> NetLab::Create(
    const LabOptions& options) {
  if (absl::Status ready = CheckLabPrerequisites(); !ready.ok()) return ready;
  RemoveLeftovers();
  std::unique_ptr<NetLab> lab(new NetLab());
  if (absl::Status built = lab->Build(options); !built.ok()) return built;
  return lab;
}

absl::Status NetLab::Build(const LabOptions& options) {
  static std::atomic<int> labs{0};
  const int n = labs++;
  prefix_ = absl::StrCat("pt", getpid(), "l", n);
  // 198.18.0.0/15 is reserved for network benchmarks (RFC 2544): one /24
  // per lab, one not routed on this machine already.
  std::string subnet;
  for (int attempt = 0; attempt < 512 && subnet.empty(); ++attempt) {
    const int index = (getpid() * 7 + n * 131 + attempt) % 512;
    const std::string candidate =
        absl::StrCat("198.", 18 + index / 256, ".", index % 256);
    std::string routes;
    absl::Status listed = RunCommand(
        {IpBinary(), "-4", "route", "show", "to", "match", candidate + ".1"},
        &routes);
    if (!listed.ok()) return listed;
    // Only the default route may cover it.
    if (routes.find("198.") == std::string::npos) {
      subnet = candidate;
    }
  }
  if (subnet.empty()) return absl::UnavailableError("no free /24 for the lab");

  std::vector<std::string> emulator_args = {EmulatorBinary()};
  address_[kControllerHost] = subnet + ".254";
  emulator_args.push_back(absl::StrCat("--host=", kControllerHost, ",-,",
                                       subnet, ".254,", prefix_));
  int k = 1;
  for (const std::string& host : options.hosts) {
    if (host.empty() || host.size() > 8 || host == kControllerHost) {
      return absl::InvalidArgumentError("bad host name " + host);
    }
    const std::string ns = prefix_ + host;
    // The namespace exists before anything can fail, so the destructor
    // removes it.
    namespaces_[host] = ns;
    if (absl::Status made = RunCommand({IpBinary(), "netns", "add", ns});
        !made.ok()) {
      namespaces_.erase(host);
      return made;
    }
    address_[host] = absl::StrCat(subnet, ".", k++);
    if (absl::Status up =
            RunCommand({IpBinary(), "-n", ns, "link", "set", "lo", "up"});
        !up.ok()) {
      return up;
    }
    // WAN-sized TCP buffers (a 1 Gb/s, 40 ms path holds 5 MB in flight).
    for (const char* sysctl : {"net.ipv4.tcp_rmem=4096 131072 33554432",
                               "net.ipv4.tcp_wmem=4096 65536 33554432"}) {
      if (absl::Status set = RunCommand(
              {IpBinary(), "netns", "exec", ns, "sysctl", "-q", "-w", sysctl});
          !set.ok()) {
        return set;
      }
    }
    emulator_args.push_back(
        absl::StrCat("--host=", host, ",", ns, ",", address_[host], ",pttun0"));
  }
  auto fmt = [](const LinkParams& p) {
    return absl::StrCat(p.rate_bits_per_s / 1e6, ",", p.delay_s * 1e3, ",",
                        p.jitter_s * 1e3, ",", p.loss);
  };
  emulator_args.push_back("--default=" + fmt(options.default_link));
  for (const auto& [pair, params] : options.links) {
    emulator_args.push_back(absl::StrCat("--link=", pair.first, ",",
                                         pair.second, ",", fmt(params)));
  }
  emulator_args.push_back(absl::StrCat("--seed=", options.seed));

  // The emulator: "ready" on stdout, its counters on stderr (a file).
  if (dir_.path().empty()) return absl::InternalError("no temporary dir");
  emulator_log_ = dir_.path() + "/emulator.log";
  const int log_fd = open(emulator_log_.c_str(),
                          O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) return absl::InternalError("cannot create " + emulator_log_);
  int ready_pipe[2];
  if (pipe2(ready_pipe, O_CLOEXEC) != 0) return absl::InternalError("pipe");
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    dup2(ready_pipe[1], STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    std::vector<char*> args;
    for (std::string& a : emulator_args) args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  emulator_pid_ = pid;
  close(ready_pipe[1]);
  close(log_fd);
  pollfd fd = {ready_pipe[0], POLLIN, 0};
  std::string said;
  while (said.find("ready") == std::string::npos) {
    if (poll(&fd, 1, 20000) <= 0) break;
    char buf[64];
    const ssize_t got = read(ready_pipe[0], buf, sizeof(buf));
    if (got <= 0) break;
    said.append(buf, got);
  }
  close(ready_pipe[0]);
  if (said.find("ready") == std::string::npos) {
    std::ifstream log(emulator_log_);
    std::stringstream text;
    text << log.rdbuf();
    return absl::InternalError("the link emulator did not start: " +
                               text.str());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::pair<std::string, std::string>, LinkCounters>>
NetLab::Counters() {
  if (emulator_pid_ <= 0) return absl::FailedPreconditionError("stopped");
  auto read_log = [&] {
    std::ifstream log(emulator_log_);
    std::stringstream text;
    text << log.rdbuf();
    return text.str();
  };
  auto ends = [](const std::string& text) {
    size_t n = 0;
    for (size_t at = text.find("end\n"); at != std::string::npos;
         at = text.find("end\n", at + 1)) {
      ++n;
    }
    return n;
  };
  const size_t before = ends(read_log());
  kill(emulator_pid_, SIGUSR1);
  std::string text;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (ends(text = read_log()) <= before) {
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError("the emulator printed no counters");
    }
    usleep(5000);
  }
  // The last block: after the previous "end" line, up to the last.
  const size_t last = text.rfind("end\n");
  const size_t previous =
      last == 0 ? std::string::npos : text.rfind("end\n", last - 1);
  std::istringstream block(
      text.substr(previous == std::string::npos ? 0 : previous + 4,
                  last - (previous == std::string::npos ? 0 : previous + 4)));
  std::map<std::pair<std::string, std::string>, LinkCounters> out;
  std::string line;
  while (std::getline(block, line)) {
    char src[64], dst[64];
    long long packets, bytes, lost, dropped;
    if (std::sscanf(line.c_str(),
                    "link %63s -> %63[^:]: %lld packets, %lld bytes "
                    "delivered, %lld lost, %lld dropped",
                    src, dst, &packets, &bytes, &lost, &dropped) == 6) {
      out[{src, dst}] = LinkCounters{packets, bytes, lost, dropped};
    }
  }
  return out;
}

std::string NetLab::StopEmulator() {
  if (emulator_pid_ > 0) {
    kill(emulator_pid_, SIGTERM);
    int status = 0;
    waitpid(emulator_pid_, &status, 0);
    emulator_pid_ = -1;
    std::ifstream log(emulator_log_);
    std::stringstream text;
    text << log.rdbuf();
    // The final block: what Counters() asked for before is older.
    counters_ = text.str();
    const size_t last = counters_.rfind("end\n");
    if (last != std::string::npos && last > 0) {
      const size_t previous = counters_.rfind("end\n", last - 1);
      if (previous != std::string::npos) counters_.erase(0, previous + 4);
    }
  }
  return counters_;
}

NetLab::~NetLab() {
  StopEmulator();
  for (const std::string& cgroup : cgroups_) RemoveCgroup(cgroup);
  for (const auto& [host, ns] : namespaces_) {
    const absl::Status removed = RunCommand({IpBinary(), "netns", "del", ns});
    if (!removed.ok()) {
      std::fprintf(stderr, "netlab: %s\n", removed.ToString().c_str());
    }
  }
}

std::string NetLab::Address(const std::string& host) const {
  auto it = address_.find(host);
  return it == address_.end() ? "" : it->second;
}

std::string NetLab::Namespace(const std::string& host) const {
  auto it = namespaces_.find(host);
  return it == namespaces_.end() ? "" : it->second;
}

absl::StatusOr<std::unique_ptr<testing::ChildProcess>> NetLab::Start(
    const std::string& host, const std::string& binary,
    const std::vector<std::string>& args, const std::string& cgroup,
    double timeout_s) const {
  const std::string ns = Namespace(host);
  if (ns.empty()) return absl::InvalidArgumentError("no host " + host);
  // `ip netns exec` enters the namespace and execs the binary (and the
  // shell execs `ip`): the child's pid is the binary's.
  std::vector<std::string> all = {"netns", "exec", ns, binary};
  all.insert(all.end(), args.begin(), args.end());
  if (cgroup.empty()) {
    return testing::ChildProcess::Start(IpBinary(), all, timeout_s);
  }
  // In the cgroup, and, as a container runtime would show it, with the cpu
  // hierarchy mounted where the process looks for its limit: `ip netns
  // exec` mounts a fresh /sys in a mount namespace of its own (private to
  // the child), which hides the host's cgroup mounts. Each shell execs the
  // next program, so the pid stays the binary's.
  all.insert(all.begin() + 3,
             {"/bin/sh", "-c",
              absl::StrCat("mount -t tmpfs cgroup /sys/fs/cgroup && mkdir ",
                           kCpuCgroupRoot, " && mount -t cgroup -o cpu cgroup ",
                           kCpuCgroupRoot, " && exec \"$0\" \"$@\"")});
  all.insert(
      all.begin(),
      {"-c", "echo $$ > " + cgroup + "/cgroup.procs && exec \"$0\" \"$@\"",
       IpBinary()});
  return testing::ChildProcess::Start("/bin/sh", all, timeout_s);
}

absl::StatusOr<std::string> NetLab::Run(
    const std::string& host, const std::vector<std::string>& argv) const {
  std::vector<std::string> all = argv;
  if (host != kControllerHost) {
    const std::string ns = Namespace(host);
    if (ns.empty()) return absl::InvalidArgumentError("no host " + host);
    all.insert(all.begin(), {IpBinary(), "netns", "exec", ns});
  }
  std::string out;
  if (absl::Status ran = RunCommand(all, &out); !ran.ok()) return ran;
  return out;
}

absl::StatusOr<std::string> NetLab::CpuCgroup(double cpu_share) {
  const std::string dir =
      absl::StrCat(kCpuCgroupRoot, "/", prefix_, "cpu", cgroups_.size());
  if (mkdir(dir.c_str(), 0755) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot create the CPU cgroup ", dir, ": ", std::strerror(errno)));
  }
  cgroups_.push_back(dir);
  const int period = 100000;
  if (!WriteFile(dir + "/cpu.cfs_period_us", std::to_string(period)) ||
      !WriteFile(dir + "/cpu.cfs_quota_us",
                 std::to_string(static_cast<int>(cpu_share * period)))) {
    return absl::FailedPreconditionError("cannot set the CPU quota in " + dir);
  }
  return dir;
}

}  // namespace pipetrain::netlab
