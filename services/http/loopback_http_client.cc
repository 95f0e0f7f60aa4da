#include "services/http/loopback_http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pipetrain::testing_http {

// Connects to 127.0.0.1:port; returns the socket or -1.
int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval timeout = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, kLoopback, &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends `raw` and reads until the server closes; parses the HTTP response.
absl::StatusOr<ClientResponse> RoundTrip(int port, const std::string& raw) {
  const int fd = ConnectLoopback(port);
  if (fd < 0) return absl::UnavailableError("connect failed");
  size_t sent = 0;
  while (sent < raw.size()) {
    const ssize_t n = send(fd, raw.data() + sent, raw.size() - sent, 0);
    if (n <= 0) break;  // the server may answer (413) before reading it all
    sent += static_cast<size_t>(n);
  }
  std::string data;
  char buf[8192];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) data.append(buf, n);
  close(fd);

  const size_t header_end = data.find("\r\n\r\n");
  if (header_end == std::string::npos) {
    return absl::DataLossError(absl::StrCat("no header end in: ", data));
  }
  std::vector<std::string> lines =
      absl::StrSplit(data.substr(0, header_end), "\r\n");
  ClientResponse response;
  std::vector<std::string> status_line = absl::StrSplit(lines[0], ' ');
  if (status_line.size() < 2 ||
      !absl::SimpleAtoi(status_line[1], &response.status)) {
    return absl::DataLossError(absl::StrCat("bad status line: ", lines[0]));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    response.headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
  }
  response.body = data.substr(header_end + 4);
  return response;
}

absl::StatusOr<ClientResponse> Send(int port, const std::string& method,
                                    const std::string& target,
                                    const std::string& body,
                                    const std::string& extra_headers) {
  return RoundTrip(
      port, absl::StrCat(method, " ", target, " HTTP/1.1\r\nHost: ", kLoopback,
                         "\r\nConnection: close\r\n", extra_headers,
                         "Content-Length: ", body.size(), "\r\n\r\n", body));
}

}  // namespace pipetrain::testing_http
