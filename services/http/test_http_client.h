// HTTP and HTTPS requests to the project's own servers on 127.0.0.1, for
// tests and benchmarks: a thin layer over httplib::Client that returns a
// status instead of httplib's error enum.
//
//   absl::StatusOr<ClientResponse> r = Send(port, "GET", "/metrics");
//   ClientOptions tls{.ca_file = pki_ca};  // HTTPS, server checked against it
//   r = Send(port, "POST", "/v1/jobs", body, {{"Authorization", "Bearer t"}},
//            tls);
#ifndef PIPETRAIN_SERVICES_HTTP_TEST_HTTP_CLIENT_H_
#define PIPETRAIN_SERVICES_HTTP_TEST_HTTP_CLIENT_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace pipetrain::testing_http {

inline constexpr char kLoopback[] = "127.0.0.1";

struct ClientOptions {
  // Non-empty: HTTPS, verifying the server's certificate against this CA
  // (and its name against 127.0.0.1).
  std::string ca_file;
  int timeout_seconds = 10;
  // Gzip the request body (Content-Encoding: gzip).
  bool gzip = false;
};

struct ClientResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

using Headers = std::map<std::string, std::string>;

// One request (Connection: close) to 127.0.0.1:port. `target` is the path
// and query as sent. Unavailable when no HTTP response came back (refused,
// reset, TLS handshake failed), naming httplib's error.
absl::StatusOr<ClientResponse> Send(int port, const std::string& method,
                                    const std::string& target,
                                    const std::string& body = "",
                                    const Headers& headers = {},
                                    const ClientOptions& options = {});

// POSTs `body` with chunked transfer encoding (no Content-Length).
absl::StatusOr<ClientResponse> SendChunked(int port, const std::string& target,
                                           const std::string& body,
                                           const ClientOptions& options = {});

// Writes `raw` bytes as they are over plain TCP and returns the status code
// of the answer. Only for requests no HTTP client would send (a declared
// Content-Length with no body behind it).
absl::StatusOr<int> RawStatus(int port, const std::string& raw);

}  // namespace pipetrain::testing_http

#endif  // PIPETRAIN_SERVICES_HTTP_TEST_HTTP_CLIENT_H_
