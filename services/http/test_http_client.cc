#include "services/http/test_http_client.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pipetrain::testing_http {
namespace {

std::unique_ptr<httplib::Client> NewClient(int port,
                                           const ClientOptions& options) {
  const bool https = !options.ca_file.empty();
  auto client = std::make_unique<httplib::Client>(
      absl::StrCat(https ? "https://" : "http://", kLoopback, ":", port));
  if (https) client->set_ca_cert_path(options.ca_file);
  client->set_connection_timeout(options.timeout_seconds);
  client->set_read_timeout(options.timeout_seconds);
  client->set_write_timeout(options.timeout_seconds);
  client->set_compress(options.gzip);
  return client;
}

absl::StatusOr<ClientResponse> FromResult(const httplib::Result& result,
                                          int port) {
  if (!result) {
    return absl::UnavailableError(
        absl::StrCat("no HTTP response from ", kLoopback, ":", port, ": ",
                     httplib::to_string(result.error())));
  }
  ClientResponse response;
  response.status = result->status;
  response.body = result->body;
  for (const auto& [name, value] : result->headers) {
    response.headers[absl::AsciiStrToLower(name)] = value;
  }
  return response;
}

}  // namespace

absl::StatusOr<ClientResponse> Send(int port, const std::string& method,
                                    const std::string& target,
                                    const std::string& body,
                                    const Headers& headers,
                                    const ClientOptions& options) {
  std::unique_ptr<httplib::Client> client = NewClient(port, options);
  httplib::Request request;
  request.method = method;
  request.path = target;
  request.body = body;
  for (const auto& [name, value] : headers) request.set_header(name, value);
  return FromResult(client->send(request), port);
}

absl::StatusOr<ClientResponse> SendChunked(int port, const std::string& target,
                                           const std::string& body,
                                           const ClientOptions& options) {
  std::unique_ptr<httplib::Client> client = NewClient(port, options);
  // Without a length, httplib sends each sink write as one chunk.
  httplib::ContentProviderWithoutLength provider =
      [&body](size_t offset, httplib::DataSink& sink) {
        if (offset >= body.size()) {
          sink.done();
          return true;
        }
        const size_t n = std::min<size_t>(512, body.size() - offset);
        return sink.write(body.data() + offset, n);
      };
  return FromResult(client->Post(target, provider, "application/json"), port);
}

absl::StatusOr<int> RawStatus(int port, const std::string& raw) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError("socket failed");
  timeval timeout = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, kLoopback, &addr.sin_addr);
  std::string answer;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      send(fd, raw.data(), raw.size(), MSG_NOSIGNAL) >= 0) {
    char buf[256];
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n > 0) answer.assign(buf, static_cast<size_t>(n));
  }
  close(fd);
  // "HTTP/1.1 413 Payload Too Large\r\n..."
  int status = 0;
  if (answer.size() < 12 || answer.compare(0, 5, "HTTP/") != 0 ||
      !absl::SimpleAtoi(answer.substr(9, 3), &status)) {
    return absl::DataLossError(
        absl::StrCat("no HTTP status line in '", answer.substr(0, 40), "'"));
  }
  return status;
}

}  // namespace pipetrain::testing_http
