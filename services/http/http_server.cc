#include "services/http/http_server.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace pipetrain {

// Defined in thread_stack_floor.cc (see there for why).
size_t ThreadStackFloorBytes();
namespace {

// civetweb keeps global state that must be set up once per process.
void InitCivetwebOnce() {
  static std::once_flag once;
  std::call_once(once, [] { mg_init_library(0); });
}

int OnCivetwebLog(const mg_connection* /*conn*/, const char* message) {
  PT_LOG(WARNING) << "civetweb: " << message;
  return 1;  // handled; civetweb prints nothing itself
}

std::string JsonQuote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c < 0x20) {
      char buf[8];
      snprintf(buf, sizeof(buf), "\\u%04x", c);
      out.append(buf);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out.push_back('"');
  return out;
}

HttpResponse ErrorResponse(int status, const std::string& message) {
  HttpResponse response;
  response.status = status;
  response.body = absl::StrCat("{\"error\": ", JsonQuote(message), "}");
  return response;
}

// "/api/" -> "/api", "api" -> "/api"; the root stays "/".
std::string NormalizePrefix(const std::string& prefix) {
  std::string out =
      (prefix.empty() || prefix[0] != '/') ? "/" + prefix : prefix;
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

// True when `prefix` (normalized) covers whole segments at the start of
// `path`.
bool PrefixMatches(const std::string& prefix, const std::string& path) {
  if (prefix == "/") return true;
  if (path.compare(0, prefix.size(), prefix) != 0) return false;
  return path.size() == prefix.size() || path[prefix.size()] == '/';
}

enum class BodyResult { kOk, kTooLarge, kReadError };

// Reads the request body, stopping once it would exceed `max_bytes`.
BodyResult ReadBody(mg_connection* conn, long long content_length,
                    size_t max_bytes, std::string* body) {
  if (content_length > static_cast<long long>(max_bytes)) {
    return BodyResult::kTooLarge;
  }
  if (content_length > 0) body->reserve(static_cast<size_t>(content_length));
  char buf[16384];
  while (true) {
    const int n = mg_read(conn, buf, sizeof(buf));
    if (n == 0) return BodyResult::kOk;
    if (n < 0) return BodyResult::kReadError;
    if (body->size() + static_cast<size_t>(n) > max_bytes) {
      return BodyResult::kTooLarge;
    }
    body->append(buf, static_cast<size_t>(n));
  }
}

HttpRequest RequestFromConnection(const mg_request_info& info) {
  HttpRequest request;
  request.method = info.request_method != nullptr ? info.request_method : "";
  const char* path =
      info.local_uri != nullptr ? info.local_uri : info.request_uri;
  request.path = path != nullptr ? path : "/";
  if (info.query_string != nullptr) request.query = info.query_string;
  for (int i = 0; i < info.num_headers; ++i) {
    const mg_header& header = info.http_headers[i];
    if (header.name == nullptr) continue;
    std::string& value = request.headers[absl::AsciiStrToLower(header.name)];
    if (!value.empty()) value.append(", ");
    value.append(header.value != nullptr ? header.value : "");
  }
  return request;
}

void SendResponse(mg_connection* conn, const HttpResponse& response) {
  mg_response_header_start(conn, response.status);
  mg_response_header_add(conn, "Content-Type", response.content_type.c_str(),
                         -1);
  const std::string length = std::to_string(response.body.size());
  mg_response_header_add(conn, "Content-Length", length.c_str(), -1);
  for (const auto& [name, value] : response.headers) {
    mg_response_header_add(conn, name.c_str(), value.c_str(), -1);
  }
  mg_response_header_send(conn);
  if (!response.body.empty()) {
    mg_write(conn, response.body.data(), response.body.size());
  }
}

// civetweb reports a failed bind only as "Failed to setup server ports";
// binding the address ourselves names the cause (e.g. address in use).
std::string ProbeBindError(const HttpServerOptions& options) {
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(options.port));
  inet_pton(AF_INET, options.host.empty() ? "0.0.0.0" : options.host.c_str(),
            &addr.sin_addr);
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  std::string cause;
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    cause = absl::StrCat(" (bind: ", strerror(errno), ")");
  }
  close(fd);
  return cause;
}

absl::Status ValidateOptions(const HttpServerOptions& options) {
  in_addr addr;
  if (!options.host.empty() &&
      inet_pton(AF_INET, options.host.c_str(), &addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("http: host '", options.host, "' is not an IPv4 address"));
  }
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("http: port ", options.port, " out of range"));
  }
  if (options.threads < 1 || options.threads > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "http: thread count ", options.threads, " out of range [1, 1024]"));
  }
  if (options.request_timeout_ms < 1) {
    return absl::InvalidArgumentError("http: request timeout must be > 0");
  }
  return absl::OkStatus();
}

}  // namespace

HttpServer::HttpServer(HttpServerOptions options)
    : options_(std::move(options)) {}

HttpServer::~HttpServer() { Stop(); }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const std::string& host, int port, int threads) {
  HttpServerOptions options;
  options.host = host;
  options.port = port;
  options.threads = threads;
  return Start(options);
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const HttpServerOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  InitCivetwebOnce();
  // Keeps the thread stack floor linked in; civetweb threads need it.
  static_cast<void>(ThreadStackFloorBytes());
  std::unique_ptr<HttpServer> server(new HttpServer(options));

  const std::string address = absl::StrCat(
      options.host.empty() ? "0.0.0.0" : options.host, ":", options.port);
  const std::string threads = std::to_string(options.threads);
  const std::string timeout = std::to_string(options.request_timeout_ms);
  const char* config[] = {
      "listening_ports",    address.c_str(), "num_threads", threads.c_str(),
      "request_timeout_ms", timeout.c_str(), nullptr};
  mg_callbacks callbacks = {};
  callbacks.begin_request = &HttpServer::OnRequest;
  callbacks.log_message = &OnCivetwebLog;
  mg_init_data init = {};
  init.callbacks = &callbacks;
  init.user_data = server.get();
  init.configuration_options = config;
  char error_text[256] = "";
  mg_error_data error = {};
  error.text = error_text;
  error.text_buffer_size = sizeof(error_text);

  mg_context* ctx = mg_start2(&init, &error);
  if (ctx == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "http: cannot listen on ", address, ": ",
        error_text[0] != '\0' ? error_text : "civetweb failed to start",
        ProbeBindError(options)));
  }
  mg_server_port ports[1] = {};
  if (mg_get_server_ports(ctx, 1, ports) < 1 || ports[0].port <= 0) {
    mg_stop(ctx);
    return absl::InternalError(
        absl::StrCat("http: no listening port after binding ", address));
  }
  server->port_ = ports[0].port;
  absl::MutexLock lock(&server->lifecycle_mu_);
  server->ctx_ = ctx;
  return server;
}

void HttpServer::Stop() {
  absl::MutexLock lock(&lifecycle_mu_);
  if (ctx_ == nullptr) return;
  // civetweb's accept loop checks its stop flag only between polls of up to
  // two seconds; connecting to ourselves wakes it so Stop returns promptly.
  std::atomic<bool> stopped{false};
  std::thread waker([this, &stopped] { WakeAcceptLoop(&stopped); });
  mg_stop(ctx_);  // joins the worker threads
  stopped.store(true);
  waker.join();
  ctx_ = nullptr;
}

void HttpServer::WakeAcceptLoop(const std::atomic<bool>* stopped) const {
  const std::string& host = options_.host;
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port_));
  inet_pton(AF_INET,
            host.empty() || host == "0.0.0.0" ? "127.0.0.1" : host.c_str(),
            &addr.sin_addr);
  while (true) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (stopped->load()) return;
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    (void)connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
    close(fd);
  }
}

void HttpServer::Handle(const std::string& method,
                        const std::string& path_prefix, HttpHandler handler) {
  const std::string prefix = NormalizePrefix(path_prefix);
  const std::string upper = absl::AsciiStrToUpper(method);
  absl::MutexLock lock(&routes_mu_);
  if (handler) {
    routes_[prefix][upper] =
        std::make_shared<const HttpHandler>(std::move(handler));
    return;
  }
  auto it = routes_.find(prefix);
  if (it == routes_.end()) return;
  it->second.erase(upper);
  if (it->second.empty()) routes_.erase(it);
}

HttpResponse HttpServer::Dispatch(const HttpRequest& request) const {
  std::shared_ptr<const HttpHandler> handler;
  std::vector<std::string> allowed;
  {
    absl::MutexLock lock(&routes_mu_);
    const std::map<std::string, std::shared_ptr<const HttpHandler>>* best =
        nullptr;
    size_t best_length = 0;
    for (const auto& [prefix, methods] : routes_) {
      if (PrefixMatches(prefix, request.path) &&
          (best == nullptr || prefix.size() > best_length)) {
        best = &methods;
        best_length = prefix.size();
      }
    }
    if (best == nullptr) {
      return ErrorResponse(404, absl::StrCat("no route for ", request.path));
    }
    auto it = best->find(request.method);
    if (it != best->end()) {
      handler = it->second;
    } else {
      for (const auto& entry : *best) allowed.push_back(entry.first);
    }
  }
  if (handler == nullptr) {
    HttpResponse response =
        ErrorResponse(405, absl::StrCat("method ", request.method,
                                        " not allowed on ", request.path));
    response.headers.emplace_back("Allow", absl::StrJoin(allowed, ", "));
    return response;
  }
  return (*handler)(request);  // no lock held: handlers may take their time
}

int HttpServer::OnRequest(mg_connection* conn) {
  const mg_request_info* info = mg_get_request_info(conn);
  if (info == nullptr) return 0;
  const HttpServer* server = static_cast<const HttpServer*>(info->user_data);
  HttpRequest request = RequestFromConnection(*info);
  HttpResponse response;
  switch (ReadBody(conn, info->content_length, server->options_.max_body_bytes,
                   &request.body)) {
    case BodyResult::kTooLarge:
      // Close instead of draining the rest of the body, which civetweb would
      // otherwise do (up to the request timeout) to keep the connection.
      mg_disable_connection_keep_alive(conn);
      response = ErrorResponse(
          413, absl::StrCat("request body exceeds ",
                            server->options_.max_body_bytes, " bytes"));
      break;
    case BodyResult::kReadError:
      mg_disable_connection_keep_alive(conn);
      response = ErrorResponse(400, "could not read the request body");
      break;
    case BodyResult::kOk:
      response = server->Dispatch(request);
      break;
  }
  SendResponse(conn, response);
  return response.status;
}

void ServeMetrics(HttpServer* server, const MetricsRegistry* registry) {
  server->Handle("GET", "/metrics", [registry](const HttpRequest&) {
    HttpResponse response;
    response.content_type = kPrometheusTextContentType;
    response.body = registry->RenderText();
    return response;
  });
}

}  // namespace pipetrain
