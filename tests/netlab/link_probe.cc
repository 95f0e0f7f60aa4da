// pipetrain-link-probe: measures what a lab link does to TCP.
//
//   pipetrain-link-probe serve --listen=ADDRESS --port_file=PATH
//       serves forever: per connection, a 'P' is answered with one byte
//       (a round trip); 'S' followed by 8 bytes of a length N is followed by
//       N bytes, answered with one byte once all arrived.
//   pipetrain-link-probe rtt --to=ADDRESS:PORT [--count=20]
//       prints "rtt_min_ms=... rtt_median_ms=..." of one-byte round trips.
//   pipetrain-link-probe send --to=ADDRESS:PORT --bytes=N
//       prints "seconds=... mbit_per_s=..." for N bytes and the answer
//       (the answer's half round trip is included).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "link_probe: %s\n", what.c_str());
  std::exit(2);
}

std::string Flag(int argc, char** argv, const std::string& name,
                 const std::string& fallback = "") {
  const std::string prefix = "--" + name + "=";
  for (int i = 2; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) {
      return argv[i] + prefix.size();
    }
  }
  return fallback;
}

sockaddr_in Parse(const std::string& address) {
  const size_t colon = address.rfind(':');
  sockaddr_in a;
  std::memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_port = htons(
      colon == std::string::npos ? 0 : std::atoi(address.c_str() + colon + 1));
  if (inet_pton(AF_INET, address.substr(0, colon).c_str(), &a.sin_addr) != 1) {
    Die("bad address " + address);
  }
  return a;
}

bool ReadAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t got = read(fd, p, n);
    if (got <= 0) return false;
    p += got;
    n -= got;
  }
  return true;
}

bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t put = write(fd, p, n);
    if (put <= 0) return false;
    p += put;
    n -= put;
  }
  return true;
}

void Serve(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::vector<char> buffer(1 << 20);
  char kind;
  while (ReadAll(fd, &kind, 1)) {
    if (kind == 'S') {
      uint64_t left;
      if (!ReadAll(fd, &left, sizeof(left))) break;
      while (left > 0) {
        const ssize_t got =
            read(fd, buffer.data(), std::min<uint64_t>(left, buffer.size()));
        if (got <= 0) break;
        left -= got;
      }
    }
    if (!WriteAll(fd, &kind, 1)) break;
  }
  close(fd);
}

int Connect(const std::string& to) {
  const sockaddr_in a = Parse(to);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0) {
    Die("cannot connect to " + to);
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) Die("serve, rtt or send");
  const std::string mode = argv[1];
  if (mode == "serve") {
    sockaddr_in a = Parse(Flag(argc, argv, "listen", "0.0.0.0") + ":0");
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        listen(fd, 16) != 0) {
      Die("cannot listen");
    }
    socklen_t len = sizeof(a);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    const std::string port_file = Flag(argc, argv, "port_file");
    {
      std::ofstream out(port_file + ".tmp");
      out << "probe=" << ntohs(a.sin_port) << "\n";
    }
    std::rename((port_file + ".tmp").c_str(), port_file.c_str());
    while (true) {
      const int c = accept(fd, nullptr, nullptr);
      if (c >= 0) std::thread(Serve, c).detach();
    }
  }
  const std::string to = Flag(argc, argv, "to");
  if (mode == "rtt") {
    const int count = std::atoi(Flag(argc, argv, "count", "20").c_str());
    const int fd = Connect(to);
    std::vector<double> rtts;
    for (int i = 0; i < count; ++i) {
      const auto start = Clock::now();
      char c = 'P';
      if (!WriteAll(fd, &c, 1) || !ReadAll(fd, &c, 1)) Die("connection lost");
      rtts.push_back(Since(start));
    }
    std::sort(rtts.begin(), rtts.end());
    std::printf("rtt_min_ms=%.3f rtt_median_ms=%.3f\n", rtts.front() * 1e3,
                rtts[rtts.size() / 2] * 1e3);
    return 0;
  }
  if (mode == "send") {
    const uint64_t bytes =
        std::strtoull(Flag(argc, argv, "bytes").c_str(), nullptr, 10);
    const int fd = Connect(to);
    std::vector<char> buffer(1 << 20, 'x');
    const auto start = Clock::now();
    char c = 'S';
    if (!WriteAll(fd, &c, 1) || !WriteAll(fd, &bytes, sizeof(bytes))) {
      Die("connection lost");
    }
    for (uint64_t left = bytes; left > 0;) {
      const size_t n = std::min<uint64_t>(left, buffer.size());
      if (!WriteAll(fd, buffer.data(), n)) Die("connection lost");
      left -= n;
    }
    if (!ReadAll(fd, &c, 1)) Die("connection lost");
    const double seconds = Since(start);
    std::printf("seconds=%.4f mbit_per_s=%.2f\n", seconds,
                bytes * 8 / seconds / 1e6);
    return 0;
  }
  Die("unknown mode " + mode);
}
