#include "services/http/http_server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace pipetrain {

namespace {

// httplib matches routes with std::regex; this one takes every path. Paths
// are bounded by httplib's 8 KiB request-line limit (longer ones get 414
// before routing), which keeps libstdc++'s recursive matcher shallow.
constexpr char kAnyPath[] = ".*";

// Headers httplib adds to a request itself; they are not the client's.
bool IsAddedByHttplib(const std::string& name) {
  return name == "REMOTE_ADDR" || name == "REMOTE_PORT" ||
         name == "LOCAL_ADDR" || name == "LOCAL_PORT";
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

enum class BodyResult { kOk, kTooLarge, kReadError, kMultipart };

HttpRequest RequestFrom(const httplib::Request& in) {
  HttpRequest request;
  request.method = in.method;
  request.path = in.path;  // decoded by httplib
  const size_t question = in.target.find('?');
  if (question != std::string::npos)
    request.query = in.target.substr(question + 1);
  for (const auto& [name, value] : in.headers) {
    if (IsAddedByHttplib(name)) continue;
    std::string& joined = request.headers[absl::AsciiStrToLower(name)];
    if (!joined.empty()) joined.append(", ");
    joined.append(value);
  }
  return request;
}

void SendTo(const HttpResponse& response, httplib::Response* out) {
  out->status = response.status;
  for (const auto& [name, value] : response.headers) {
    out->set_header(name, value);
  }
  // Sets Content-Type; httplib adds Content-Length.
  out->set_content(response.body, response.content_type);
}

// Reads the request body into `body`, stopping once it would exceed
// `max_bytes` (after decoding any Content-Encoding). Without Content-Length
// or chunked encoding a request has no body (RFC 9112 6.3); httplib alone
// would read until the client closes.
BodyResult ReadBody(const httplib::Request& request,
                    const httplib::ContentReader& reader, size_t max_bytes,
                    std::string* body) {
  const bool chunked =
      request.get_header_value("Transfer-Encoding") == std::string("chunked");
  if (!chunked && !request.has_header("Content-Length")) return BodyResult::kOk;
  // httplib would parse a multipart body into parts, not bytes; no route
  // here takes one.
  if (request.is_multipart_form_data()) return BodyResult::kMultipart;
  if (!chunked) {
    // Refused from the declared length alone, before any of it is read
    // (httplib's own limit would read and discard the whole body first).
    const uint64_t declared =
        request.get_header_value<uint64_t>("Content-Length");
    if (declared > max_bytes) return BodyResult::kTooLarge;
    body->reserve(static_cast<size_t>(declared));
  }
  bool too_large = false;
  const bool read = reader([&](const char* data, size_t length) {
    if (body->size() + length > max_bytes) {
      too_large = true;
      return false;
    }
    body->append(data, length);
    return true;
  });
  if (too_large) return BodyResult::kTooLarge;
  return read ? BodyResult::kOk : BodyResult::kReadError;
}

// httplib reports a failed bind only as failure; binding the address
// ourselves names the cause (e.g. address in use).
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
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "http: a TLS certificate needs its key, and a key its certificate");
  }
  return absl::OkStatus();
}

// An idle keep-alive connection holds a pool thread this long, and Stop
// may wait for it as long.
constexpr time_t kKeepAliveSeconds = 2;

// Connections the kernel completes before the accept loop takes them.
// Debian's libcpp-httplib is compiled with a backlog of 5
// (CPPHTTPLIB_LISTEN_BACKLOG cannot be set from here): 100 clients
// connecting at once to a scheduler whose accept thread waited for a core
// lost SYNs, which clients resend after 1, 3, 7 s (bench_control's REST
// p99 about 1 s, its slowest calls 4-12 s; ARCHITECTURE "The wire"). The
// kernel caps this at net.core.somaxconn.
constexpr int kListenBacklog = SOMAXCONN;

std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return absl::StrCat(" (", text, ")");
}

absl::StatusOr<std::unique_ptr<httplib::Server>> NewHttpsServer(
    const HttpServerOptions& options) {
  std::string error;
  auto server = std::make_unique<httplib::SSLServer>([&](SSL_CTX& ctx) {
    SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(&ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
    const std::string& cert = options.tls_cert_file;
    const std::string& key = options.tls_key_file;
    if (SSL_CTX_use_certificate_chain_file(&ctx, cert.c_str()) != 1) {
      error = absl::StrCat("cannot load certificate chain ", cert);
    } else if (SSL_CTX_use_PrivateKey_file(&ctx, key.c_str(),
                                           SSL_FILETYPE_PEM) != 1) {
      error = absl::StrCat("cannot load private key ", key);
    } else if (SSL_CTX_check_private_key(&ctx) != 1) {
      error = absl::StrCat("private key ", key, " does not match ", cert);
    } else {
      return true;
    }
    absl::StrAppend(&error, OpenSslError());
    return false;
  });
  if (!server->is_valid()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "https: ", error.empty() ? "cannot create a TLS context" : error));
  }
  return server;
}

// `listen_fd` is set to each socket httplib creates for binding, so after a
// successful bind it names the listening socket.
absl::StatusOr<std::unique_ptr<httplib::Server>> NewHttplibServer(
    const HttpServerOptions& options, int* listen_fd) {
  std::unique_ptr<httplib::Server> server;
  if (options.tls_cert_file.empty()) {
    server = std::make_unique<httplib::Server>();
  } else {
    ASSIGN_OR_RETURN(server, NewHttpsServer(options));
  }
  const size_t threads = static_cast<size_t>(options.threads);
  server->new_task_queue = [threads] {
    return new httplib::ThreadPool(threads);
  };
  // httplib's default sets SO_REUSEPORT, which would let a second server
  // share a busy port instead of failing to bind it.
  server->set_socket_options([listen_fd](int fd) {
    *listen_fd = fd;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  });
  const time_t seconds = options.request_timeout_ms / 1000;
  const time_t micros = (options.request_timeout_ms % 1000) * 1000;
  server->set_read_timeout(seconds, micros);
  server->set_write_timeout(seconds, micros);
  server->set_keep_alive_timeout(kKeepAliveSeconds);
  return server;
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
  std::unique_ptr<HttpServer> server(new HttpServer(options));
  ASSIGN_OR_RETURN(server->server_,
                   NewHttplibServer(options, &server->listen_fd_));
  server->InstallCatchAllRoutes();

  const std::string host = options.host.empty() ? "0.0.0.0" : options.host;
  const std::string address = absl::StrCat(host, ":", options.port);
  const int port =
      options.port == 0
          ? server->server_->bind_to_any_port(host)
          : (server->server_->bind_to_port(host, options.port) ? options.port
                                                               : -1);
  if (port <= 0) {
    return absl::UnavailableError(absl::StrCat(
        "http: cannot listen on ", address, ProbeBindError(options)));
  }
  // Listening again on a listening socket only sets its backlog.
  if (server->listen_fd_ < 0 ||
      ::listen(server->listen_fd_, kListenBacklog) != 0) {
    return absl::UnavailableError(
        absl::StrCat("http: cannot set the listen backlog on ", address, ": ",
                     std::strerror(errno)));
  }
  server->port_ = port;
  httplib::Server* raw = server->server_.get();
  absl::MutexLock lock(&server->lifecycle_mu_);
  server->listener_ = std::thread([raw] { raw->listen_after_bind(); });
  // httplib's stop() does nothing until the accept loop has started, so a
  // Stop right after Start would leave the listener blocked in accept.
  while (!raw->is_running()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return server;
}

void HttpServer::Stop() {
  absl::MutexLock lock(&lifecycle_mu_);
  if (!listener_.joinable()) return;
  // Closes the listening socket; the accept loop then joins the pool, whose
  // threads finish their requests (an idle keep-alive connection within
  // kKeepAliveSeconds).
  server_->stop();
  listener_.join();
}

void HttpServer::InstallCatchAllRoutes() {
  httplib::Server::Handler no_body = [this](const httplib::Request& in,
                                            httplib::Response& out) {
    SendTo(Dispatch(RequestFrom(in)), &out);
  };
  httplib::Server::HandlerWithContentReader with_body =
      [this](const httplib::Request& in, httplib::Response& out,
             const httplib::ContentReader& reader) {
        SendTo(Answer(in, reader), &out);
      };
  server_->Get(kAnyPath, no_body);  // also HEAD, which Dispatch routes as such
  server_->Options(kAnyPath, no_body);
  server_->Post(kAnyPath, with_body);
  server_->Put(kAnyPath, with_body);
  server_->Patch(kAnyPath, with_body);
  server_->Delete(kAnyPath, with_body);
}

HttpResponse HttpServer::Answer(const httplib::Request& in,
                                const httplib::ContentReader& reader) const {
  HttpRequest request = RequestFrom(in);
  const size_t limit = options_.max_body_bytes;
  switch (ReadBody(in, reader, limit, &request.body)) {
    case BodyResult::kOk:
      return Dispatch(request);
    case BodyResult::kTooLarge: {
      // The rest of the body stays unread: the connection must not be
      // reused for another request.
      HttpResponse response = ErrorResponse(
          413, absl::StrCat("request body exceeds ", limit, " bytes"));
      response.headers.emplace_back("Connection", "close");
      return response;
    }
    case BodyResult::kMultipart:
      return ErrorResponse(415, "multipart bodies are not accepted");
    case BodyResult::kReadError:
      break;
  }
  HttpResponse response = ErrorResponse(400, "could not read the request body");
  response.headers.emplace_back("Connection", "close");
  return response;
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

void ServeMetrics(HttpServer* server, const MetricsRegistry* registry) {
  server->Handle("GET", "/metrics", [registry](const HttpRequest&) {
    HttpResponse response;
    response.content_type = kPrometheusTextContentType;
    response.body = registry->RenderText();
    return response;
  });
}

}  // namespace pipetrain
