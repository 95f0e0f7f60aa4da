// A small embedded HTTP/1.1 server for /metrics, health and JSON admin
// routes, built on civetweb's C API (CivetServer.h throws; we never do).
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
// {"error": "..."}. Bodies over the configured limit → 413.
#ifndef PIPETRAIN_SERVICES_HTTP_HTTP_SERVER_H_
#define PIPETRAIN_SERVICES_HTTP_HTTP_SERVER_H_

#include <atomic>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"

struct mg_context;
struct mg_connection;

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
};

// Thread-safe: Handle, port and Stop may be called from any thread,
// concurrently with requests being served. Stop (and the destructor) wait
// for handlers that are running to return.
class HttpServer {
 public:
  // Binds and starts serving. kInvalidArgument for a bad host, port, thread
  // count or limit; kUnavailable (naming host:port) when the port cannot be
  // bound, e.g. because it is busy.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const HttpServerOptions& options);
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const std::string& host, int port, int threads);

  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The port actually bound (the chosen one when 0 was requested).
  int port() const { return port_; }

  // Routes `method` (case-insensitive) on `path_prefix` to `handler`,
  // replacing any handler for the same pair; a null handler removes it.
  // May be called before or after requests arrive. A prefix without a
  // leading '/' gets one; a trailing '/' (other than the root) is ignored.
  void Handle(const std::string& method, const std::string& path_prefix,
              HttpHandler handler);

  // Stops listening and waits for running handlers. Idempotent.
  void Stop();

 private:
  explicit HttpServer(HttpServerOptions options);

  // civetweb entry point; `conn` belongs to a civetweb worker thread.
  static int OnRequest(mg_connection* conn);
  // Connects to the listening port every few milliseconds until `stopped`.
  void WakeAcceptLoop(const std::atomic<bool>* stopped) const;
  // Routes and answers one request.
  HttpResponse Dispatch(const HttpRequest& request) const;

  // Constant after Start.
  const HttpServerOptions options_;
  int port_ = 0;

  // Serializes Stop; held across mg_stop so a second Stop returns only once
  // the server has stopped.
  absl::Mutex lifecycle_mu_;
  mg_context* ctx_ ABSL_GUARDED_BY(lifecycle_mu_) = nullptr;

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
