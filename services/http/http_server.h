// A small embedded HTTP/1.1 (or HTTPS) server for /metrics, health and JSON
// admin routes, built on cpp-httplib (Debian's libcpp-httplib, linked with
// OpenSSL 3). Nothing here throws; httplib's handlers run on its own pool
// threads, which have the default (8 MiB) stack.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<HttpServer> http,
//                    HttpServer::Start("0.0.0.0", 9100, 2));
//   ServeMetrics(http.get(), &registry);
//   http->Handle("GET", "/status", [](const HttpRequest&) {
//     return HttpResponse{200, "application/json", R"({"ok": true})"};
//   });
//
// Routing is by method and longest matching path prefix, where a prefix
// matches whole path segments: "/api" matches "/api" and "/api/jobs/7" but
// not "/apix"; "/" matches everything. No route → 404, a route without the
// request's method → 405 (with an Allow header); both have a JSON body
// {"error": "..."}. Bodies over the configured limit → 413 (also when only
// the declared Content-Length is too large: the body is then never read).
// With a certificate and key in the options the port speaks only HTTPS; a
// plaintext request to it fails the TLS handshake and is closed.
#ifndef PIPETRAIN_SERVICES_HTTP_HTTP_SERVER_H_
#define PIPETRAIN_SERVICES_HTTP_HTTP_SERVER_H_

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics_registry.h"

namespace httplib {
class ContentReader;
struct Request;
class Server;
}  // namespace httplib

namespace pipetrain {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // URL-decoded, without the query string
  std::string query;   // raw text after '?', empty if none
  std::string body;
  std::map<std::string, std::string> headers;  // names lower-cased
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  // Extra headers; Content-Type and Content-Length are set by the server.
  std::vector<std::pair<std::string, std::string>> headers;
};

// Runs on one of the server's worker threads, possibly on several at once;
// must be thread-safe and must not call HttpServer::Stop (it would wait for
// itself).
using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

struct HttpServerOptions {
  // IPv4 address to listen on; "0.0.0.0" or "" for every interface.
  std::string host = "0.0.0.0";
  int port = 0;  // 0 picks a free port; see HttpServer::port()
  int threads = 2;
  size_t max_body_bytes = size_t{16} << 20;
  int request_timeout_ms = 30000;
  // PEM certificate chain and private key: serve HTTPS (TLS 1.2 or later)
  // with them. Both or neither. Clients are not asked for certificates.
  std::string tls_cert_file;
  std::string tls_key_file;
};

// Thread-safe: Handle, port and Stop may be called from any thread,
// concurrently with requests being served. Stop (and the destructor) wait
// for handlers that are running to return.
class HttpServer {
 public:
  // Binds and starts serving. kInvalidArgument for a bad host, port, thread
  // count or limit, or a certificate/key that cannot be loaded; kUnavailable
  // (naming host:port) when the port cannot be bound, e.g. because it is
  // busy.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const HttpServerOptions& options);
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const std::string& host, int port, int threads);

  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The port actually bound (the chosen one when 0 was requested).
  int port() const { return port_; }
  // True when the port speaks HTTPS.
  bool https() const { return !options_.tls_cert_file.empty(); }

  // Routes `method` (case-insensitive) on `path_prefix` to `handler`,
  // replacing any handler for the same pair; a null handler removes it.
  // May be called before or after requests arrive. A prefix without a
  // leading '/' gets one; a trailing '/' (other than the root) is ignored.
  void Handle(const std::string& method, const std::string& path_prefix,
              HttpHandler handler);

  // Stops listening and waits for running handlers. Idempotent.
  void Stop();

  // Routes and answers one request whose body has been read, as a
  // connection's request is answered; in-process callers (the REST fuzzer)
  // use it without a connection.
  HttpResponse Dispatch(const HttpRequest& request) const;

 private:
  explicit HttpServer(HttpServerOptions options);

  // Sends every method and path to Dispatch, reading bodies under the
  // limit; runs once in Start, before the listener starts.
  void InstallCatchAllRoutes();
  // Reads the body of a request that may have one and dispatches it.
  HttpResponse Answer(const httplib::Request& in,
                      const httplib::ContentReader& reader) const;

  // Constant after Start.
  const HttpServerOptions options_;
  int port_ = 0;
  // The listening socket (httplib owns it); set while Start binds.
  int listen_fd_ = -1;

  // Set in Start, never replaced; its handlers only call Dispatch.
  std::unique_ptr<httplib::Server> server_;

  // Serializes Stop; held across the listener's join so a second Stop
  // returns only once the server has stopped.
  absl::Mutex lifecycle_mu_;
  // Runs httplib's accept loop; joinable until Stop.
  std::thread listener_ ABSL_GUARDED_BY(lifecycle_mu_);

  // Guards the routing table; never held while a handler runs.
  mutable absl::Mutex routes_mu_;
  // path prefix -> method -> handler.
  std::map<std::string,
           std::map<std::string, std::shared_ptr<const HttpHandler>>>
      routes_ ABSL_GUARDED_BY(routes_mu_);
};

// Content type of the Prometheus text exposition format.
inline constexpr char kPrometheusTextContentType[] =
    "text/plain; version=0.0.4; charset=utf-8";

// Serves `registry` at GET /metrics. `registry` is borrowed and must outlive
// the server (or the route).
void ServeMetrics(HttpServer* server, const MetricsRegistry* registry);

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_HTTP_HTTP_SERVER_H_
