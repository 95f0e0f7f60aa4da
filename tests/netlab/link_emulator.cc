// pipetrain-link-emulator: emulated links between network namespaces, at
// the packet level, for kernels without sch_netem.
//
// For every host it creates a TUN device inside the host's namespace,
// gives it the host's address (a /prefix_len subnet through the device) and
// then, on one thread, reads each host's outgoing IPv4 packets, finds the
// destination host by address and writes the packet to that host's device
// once the directed link (source host, destination host) lets it arrive
// (tests/netlab/link_model.h: rate, delay, jitter, loss, a drop-tail
// queue). Prints "ready" once every device is up. Prints each link's
// counters to stderr on SIGUSR1, and on SIGTERM or SIGINT before it exits;
// the devices vanish with their file descriptors. It dies with the process
// that started it.
//
//   pipetrain-link-emulator --host=NAME,NETNS,ADDRESS,DEVICE ...
//       [--default=RATE_MBIT,DELAY_MS,JITTER_MS,LOSS]
//       [--link=SRC,DST,RATE_MBIT,DELAY_MS,JITTER_MS,LOSS ...]
//       [--seed=N] [--prefix_len=24] [--mtu=65000]
//
// NETNS "-" is the emulator's own namespace; a rate of 0 is unlimited. A
// --link sets one direction; pairs without one take --default.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <queue>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tests/netlab/link_model.h"

namespace pipetrain::netlab {
namespace {

struct Host {
  std::string name, netns, address, device;
  uint32_t ip = 0;  // network byte order
  int fd = -1;
};

struct Packet {
  int64_t due_ns;
  uint64_t seq;  // FIFO among equal due times
  int dst;
  std::vector<uint8_t> data;
};
struct Later {
  bool operator()(const Packet* a, const Packet* b) const {
    return a->due_ns != b->due_ns ? a->due_ns > b->due_ns : a->seq > b->seq;
  }
};

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = s.find(',', start);
    out.push_back(s.substr(start, comma - start));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "link_emulator: %s\n", what.c_str());
  std::exit(2);
}

// Names go into `ip` command lines: letters, digits, '.', '_', '-' only.
void CheckName(const std::string& s) {
  if (s.empty() || s.size() > 64) Die("bad name '" + s + "'");
  for (char c : s) {
    if (!isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' &&
        c != '-') {
      Die("bad name '" + s + "'");
    }
  }
}

double ParseDouble(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || v < 0) Die("bad number '" + s + "'");
  return v;
}

LinkParams ParseLink(const std::vector<std::string>& f, size_t first) {
  if (f.size() != first + 4) Die("a link is RATE_MBIT,DELAY_MS,JITTER_MS,LOSS");
  LinkParams p;
  p.rate_bits_per_s = ParseDouble(f[first]) * 1e6;
  p.delay_s = ParseDouble(f[first + 1]) * 1e-3;
  p.jitter_s = ParseDouble(f[first + 2]) * 1e-3;
  p.loss = ParseDouble(f[first + 3]);
  if (p.loss >= 1) Die("loss must be below 1");
  return p;
}

void RunOrDie(const std::vector<std::string>& argv) {
  const pid_t pid = fork();
  if (pid < 0) Die("fork failed");
  if (pid == 0) {
    std::vector<char*> args;
    for (const std::string& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string line;
    for (const std::string& a : argv) line += a + " ";
    Die("failed: " + line);
  }
}

// Opens a TUN device named host.device in host.netns.
void CreateDevice(Host& host, int own_netns) {
  if (host.netns != "-") {
    const std::string path = "/var/run/netns/" + host.netns;
    const int ns = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0) Die("cannot open " + path + ": " + std::strerror(errno));
    if (setns(ns, CLONE_NEWNET) != 0) {
      Die("setns " + host.netns + ": " + std::strerror(errno));
    }
    close(ns);
  }
  host.fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (host.fd < 0) Die(std::string("/dev/net/tun: ") + std::strerror(errno));
  ifreq ifr;
  std::memset(&ifr, 0, sizeof(ifr));
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
  std::strncpy(ifr.ifr_name, host.device.c_str(), IFNAMSIZ - 1);
  if (ioctl(host.fd, TUNSETIFF, &ifr) != 0) {
    Die("TUNSETIFF " + host.device + ": " + std::strerror(errno));
  }
  if (setns(own_netns, CLONE_NEWNET) != 0) Die("setns back failed");
}

void ConfigureDevice(const Host& host, int prefix_len, int mtu) {
  std::vector<std::string> ip = {"ip"};
  if (host.netns != "-") ip = {"ip", "-n", host.netns};
  auto with = [&](std::vector<std::string> rest) {
    std::vector<std::string> all = ip;
    all.insert(all.end(), rest.begin(), rest.end());
    return all;
  };
  RunOrDie(with({"addr", "add", host.address + "/" + std::to_string(prefix_len),
                 "dev", host.device}));
  RunOrDie(
      with({"link", "set", host.device, "up", "mtu", std::to_string(mtu)}));
}

class Emulator {
 public:
  Emulator(std::vector<Host> hosts, LinkParams fallback,
           std::map<std::pair<int, int>, LinkParams> links, uint64_t seed)
      : hosts_(std::move(hosts)), rng_(seed) {
    for (size_t s = 0; s < hosts_.size(); ++s) {
      for (size_t d = 0; d < hosts_.size(); ++d) {
        auto it = links.find({int(s), int(d)});
        models_.emplace(std::make_pair(int(s), int(d)),
                        LinkModel(it == links.end() ? fallback : it->second));
      }
      by_ip_[hosts_[s].ip] = int(s);
    }
  }

  void Run(int signal_fd) {
    const int ep = epoll_create1(EPOLL_CLOEXEC);
    const int timer =
        timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (ep < 0 || timer < 0) Die("epoll/timerfd failed");
    auto watch = [&](int fd, uint64_t tag) {
      epoll_event ev;
      ev.events = EPOLLIN;
      ev.data.u64 = tag;
      if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) Die("epoll_ctl failed");
    };
    for (size_t i = 0; i < hosts_.size(); ++i) watch(hosts_[i].fd, i);
    watch(timer, kTimerTag);
    watch(signal_fd, kSignalTag);
    std::vector<uint8_t> buffer(1 << 17);
    epoll_event events[32];
    while (true) {
      const int n = epoll_wait(ep, events, 32, -1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) Die("epoll_wait failed");
      for (int e = 0; e < n; ++e) {
        const uint64_t tag = events[e].data.u64;
        if (tag == kSignalTag) {
          signalfd_siginfo info;
          if (read(signal_fd, &info, sizeof(info)) != sizeof(info)) continue;
          if (info.ssi_signo != SIGUSR1) return;
          PrintCounters();
          continue;
        }
        if (tag == kTimerTag) {
          uint64_t expirations;
          (void)!read(timer, &expirations, sizeof(expirations));
          continue;
        }
        ReadHost(int(tag), buffer);
      }
      DeliverDue();
      Arm(timer);
    }
  }

  // One line per link that carried or lost a packet, then "end".
  void PrintCounters() const {
    for (const auto& [pair, model] : models_) {
      const LinkCounters& c = model.counters();
      if (c.packets + c.lost + c.dropped == 0) continue;
      std::fprintf(
          stderr,
          "link %s -> %s: %lld packets, %lld bytes delivered, %lld "
          "lost, %lld dropped (queue full)\n",
          hosts_[pair.first].name.c_str(), hosts_[pair.second].name.c_str(),
          static_cast<long long>(c.packets), static_cast<long long>(c.bytes),
          static_cast<long long>(c.lost), static_cast<long long>(c.dropped));
    }
    std::fprintf(stderr, "end\n");
    std::fflush(stderr);
  }

 private:
  static constexpr uint64_t kTimerTag = 1u << 30;
  static constexpr uint64_t kSignalTag = kTimerTag + 1;

  void ReadHost(int src, std::vector<uint8_t>& buffer) {
    // At most a bounded batch, so one busy host does not starve the rest.
    for (int i = 0; i < 64; ++i) {
      const ssize_t got = read(hosts_[src].fd, buffer.data(), buffer.size());
      if (got <= 0) return;
      if (got < 20 || (buffer[0] >> 4) != 4) continue;  // IPv4 only
      uint32_t dst_ip;
      std::memcpy(&dst_ip, buffer.data() + 16, 4);
      auto it = by_ip_.find(dst_ip);
      if (it == by_ip_.end() || it->second == src) continue;
      const int dst = it->second;
      LinkModel& link = models_.at({src, dst});
      const double loss_draw = uniform_(rng_);
      const double jitter_draw = 2 * uniform_(rng_) - 1;
      const auto due = link.Admit(NowNs(), got, loss_draw, jitter_draw);
      if (!due.has_value()) continue;
      auto* p =
          new Packet{*due, seq_++, dst,
                     std::vector<uint8_t>(buffer.data(), buffer.data() + got)};
      pending_.push(p);
    }
  }

  void DeliverDue() {
    const int64_t now = NowNs();
    while (!pending_.empty() && pending_.top()->due_ns <= now) {
      Packet* p = pending_.top();
      pending_.pop();
      // A full receive queue on the device drops the packet, as a NIC would.
      (void)!write(hosts_[p->dst].fd, p->data.data(), p->data.size());
      delete p;
    }
  }

  void Arm(int timer) {
    itimerspec spec;
    std::memset(&spec, 0, sizeof(spec));
    if (!pending_.empty()) {
      const int64_t due = std::max<int64_t>(pending_.top()->due_ns, 1);
      spec.it_value.tv_sec = due / 1000000000;
      spec.it_value.tv_nsec = due % 1000000000;
    }
    timerfd_settime(timer, TFD_TIMER_ABSTIME, &spec, nullptr);
  }

  std::vector<Host> hosts_;
  std::map<std::pair<int, int>, LinkModel> models_;
  std::map<uint32_t, int> by_ip_;
  std::priority_queue<Packet*, std::vector<Packet*>, Later> pending_;
  uint64_t seq_ = 0;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> uniform_{0.0, 1.0};
};

int Main(int argc, char** argv) {
  // Never outlive the test or benchmark that started us.
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  std::vector<Host> hosts;
  std::vector<std::vector<std::string>> link_args;
  LinkParams fallback;
  uint64_t seed = 1;
  int prefix_len = 24;
  int mtu = 65000;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    if (key == "--host") {
      const std::vector<std::string> f = Split(value);
      if (f.size() != 4) Die("--host=NAME,NETNS,ADDRESS,DEVICE");
      Host h{f[0], f[1], f[2], f[3]};
      CheckName(h.name);
      if (h.netns != "-") CheckName(h.netns);
      CheckName(h.device);
      if (h.device.size() >= IFNAMSIZ) Die("device name too long: " + h.device);
      if (inet_pton(AF_INET, h.address.c_str(), &h.ip) != 1) {
        Die("bad address " + h.address);
      }
      hosts.push_back(h);
    } else if (key == "--link") {
      link_args.push_back(Split(value));
    } else if (key == "--default") {
      fallback = ParseLink(Split(value), 0);
    } else if (key == "--seed") {
      seed = std::strtoull(value.c_str(), nullptr, 10);
    } else if (key == "--prefix_len") {
      prefix_len = std::atoi(value.c_str());
    } else if (key == "--mtu") {
      mtu = std::atoi(value.c_str());
    } else {
      Die("unknown argument " + arg);
    }
  }
  if (hosts.size() < 2) Die("at least two --host");
  auto index = [&](const std::string& name) {
    for (size_t i = 0; i < hosts.size(); ++i) {
      if (hosts[i].name == name) return int(i);
    }
    Die("no host " + name);
  };
  std::map<std::pair<int, int>, LinkParams> links;
  for (const auto& f : link_args) {
    if (f.size() != 6) Die("--link=SRC,DST,RATE_MBIT,DELAY_MS,JITTER_MS,LOSS");
    links[{index(f[0]), index(f[1])}] = ParseLink(f, 2);
  }

  // SIGTERM/SIGINT arrive through a descriptor the loop watches.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGUSR1);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  const int signal_fd = signalfd(-1, &mask, SFD_CLOEXEC);
  if (signal_fd < 0) Die("signalfd failed");
  if (getppid() == 1) return 0;  // the parent is already gone

  const int own_netns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (own_netns < 0) Die("cannot open the own network namespace");
  for (Host& h : hosts) CreateDevice(h, own_netns);
  for (const Host& h : hosts) ConfigureDevice(h, prefix_len, mtu);

  Emulator emulator(std::move(hosts), fallback, std::move(links), seed);
  std::printf("ready\n");
  std::fflush(stdout);
  emulator.Run(signal_fd);
  emulator.PrintCounters();
  return 0;
}

}  // namespace
}  // namespace pipetrain::netlab

int main(int argc, char** argv) { return pipetrain::netlab::Main(argc, argv); }
