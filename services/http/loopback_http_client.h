// A minimal HTTP/1.1 client for tests and benchmarks. It only ever dials
// 127.0.0.1 (the project's own servers on loopback).
#ifndef PIPETRAIN_SERVICES_HTTP_LOOPBACK_HTTP_CLIENT_H_
#define PIPETRAIN_SERVICES_HTTP_LOOPBACK_HTTP_CLIENT_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace pipetrain::testing_http {

inline constexpr char kLoopback[] = "127.0.0.1";

struct ClientResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

// Connects to 127.0.0.1:port (10 s send/receive timeouts); returns the
// socket or -1.
int ConnectLoopback(int port);

// Sends `raw` and reads until the server closes; parses the HTTP response.
absl::StatusOr<ClientResponse> RoundTrip(int port, const std::string& raw);

// One request with Connection: close.
absl::StatusOr<ClientResponse> Send(int port, const std::string& method,
                                    const std::string& target,
                                    const std::string& body = "",
                                    const std::string& extra_headers = "");

}  // namespace pipetrain::testing_http

#endif  // PIPETRAIN_SERVICES_HTTP_LOOPBACK_HTTP_CLIENT_H_
