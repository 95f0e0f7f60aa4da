#include "services/http/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/auth/test_pki.h"
#include "services/http/test_http_client.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;
using testing_http::ClientOptions;
using testing_http::ClientResponse;
using testing_http::kLoopback;
using testing_http::RawStatus;
using testing_http::Send;
using testing_http::SendChunked;

std::unique_ptr<HttpServer> StartLoopback(HttpServerOptions options = {}) {
  options.host = kLoopback;
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

HttpResponse Json(std::string body) {
  HttpResponse response;
  response.body = std::move(body);
  return response;
}

TEST(HttpServer, ServesMetricsOnAPickedPort) {
  MetricsRegistry registry;
  (*registry.GetCounter("pipetrain_test_requests_total", "Requests."))
      ->Increment(3);
  std::unique_ptr<HttpServer> server = StartLoopback();
  ASSERT_NE(server, nullptr);
  EXPECT_GT(server->port(), 0);
  ServeMetrics(server.get(), &registry);

  absl::StatusOr<ClientResponse> r = Send(server->port(), "GET", "/metrics");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->headers["content-type"], kPrometheusTextContentType);
  EXPECT_EQ(r->body, registry.RenderText());
  EXPECT_THAT(r->body, HasSubstr("pipetrain_test_requests_total 3\n"));
}

TEST(HttpServer, JsonRouteSeesPathQueryAndHeaders) {
  std::unique_ptr<HttpServer> server = StartLoopback();
  ASSERT_NE(server, nullptr);
  server->Handle("get", "/echo", [](const HttpRequest& request) {
    const auto header = request.headers.find("x-pipetrain-test");
    return Json(absl::StrCat(
        "{\"method\": \"", request.method, "\", \"path\": \"", request.path,
        "\", \"query\": \"", request.query, "\", \"header\": \"",
        header == request.headers.end() ? "" : header->second, "\"}"));
  });
  absl::StatusOr<ClientResponse> r =
      Send(server->port(), "GET", "/echo/a%20b?x=1&y=2", "",
           {{"X-Pipetrain-Test", "yes"}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->headers["content-type"], "application/json");
  EXPECT_EQ(r->body,
            "{\"method\": \"GET\", \"path\": \"/echo/a b\", \"query\": "
            "\"x=1&y=2\", \"header\": \"yes\"}");
}

TEST(HttpServer, UnknownPathIs404AndWrongMethodIs405) {
  std::unique_ptr<HttpServer> server = StartLoopback();
  ASSERT_NE(server, nullptr);
  server->Handle("GET", "/status",
                 [](const HttpRequest&) { return Json("{}"); });
  server->Handle("PUT", "/status",
                 [](const HttpRequest&) { return Json("{}"); });

  absl::StatusOr<ClientResponse> missing = Send(server->port(), "GET", "/nope");
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(missing->headers["content-type"], "application/json");
  EXPECT_EQ(missing->body, "{\"error\": \"no route for /nope\"}");

  // Prefixes match whole segments only.
  absl::StatusOr<ClientResponse> sibling =
      Send(server->port(), "GET", "/statusx");
  ASSERT_TRUE(sibling.ok()) << sibling.status();
  EXPECT_EQ(sibling->status, 404);

  absl::StatusOr<ClientResponse> wrong =
      Send(server->port(), "DELETE", "/status");
  ASSERT_TRUE(wrong.ok()) << wrong.status();
  EXPECT_EQ(wrong->status, 405);
  EXPECT_EQ(wrong->headers["allow"], "GET, PUT");
  EXPECT_THAT(wrong->body, HasSubstr("\"error\": "));
}

TEST(HttpServer, LongestPrefixWinsAndRoutesCanChangeWhileServing) {
  std::unique_ptr<HttpServer> server = StartLoopback();
  ASSERT_NE(server, nullptr);
  server->Handle("GET", "/", [](const HttpRequest&) { return Json("root"); });
  server->Handle("GET", "/api", [](const HttpRequest&) { return Json("api"); });
  server->Handle("GET", "/api/jobs/",
                 [](const HttpRequest&) { return Json("jobs"); });
  const int port = server->port();
  EXPECT_EQ(Send(port, "GET", "/api/jobs/7")->body, "jobs");
  EXPECT_EQ(Send(port, "GET", "/api/jobs")->body, "jobs");
  EXPECT_EQ(Send(port, "GET", "/api/other")->body, "api");
  EXPECT_EQ(Send(port, "GET", "/apix")->body, "root");

  server->Handle("GET", "/api/jobs", nullptr);  // removes the route
  EXPECT_EQ(Send(port, "GET", "/api/jobs/7")->body, "api");
}

TEST(HttpServer, PostBodyRoundTrips) {
  std::unique_ptr<HttpServer> server = StartLoopback();
  ASSERT_NE(server, nullptr);
  server->Handle("POST", "/echo", [](const HttpRequest& request) {
    HttpResponse response;
    response.status = 201;
    response.content_type = "application/octet-stream";
    response.body = request.body;
    return response;
  });
  std::string body(300000, '\0');
  for (size_t i = 0; i < body.size(); ++i) body[i] = static_cast<char>(i * 7);
  absl::StatusOr<ClientResponse> r =
      Send(server->port(), "POST", "/echo", body);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 201);
  EXPECT_EQ(r->headers["content-type"], "application/octet-stream");
  EXPECT_TRUE(r->body == body) << "body of " << r->body.size() << " bytes";
}

TEST(HttpServer, ChunkedBodyRoundTrips) {
  std::unique_ptr<HttpServer> server = StartLoopback();
  ASSERT_NE(server, nullptr);
  server->Handle("POST", "/echo",
                 [](const HttpRequest& request) { return Json(request.body); });
  std::string body(1500, '\0');
  for (size_t i = 0; i < body.size(); ++i) body[i] = 'a' + i % 26;
  absl::StatusOr<ClientResponse> r =
      SendChunked(server->port(), "/echo", body);  // three chunks
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, body);
}

TEST(HttpServer, OversizedBodiesAre413) {
  HttpServerOptions options;
  options.max_body_bytes = 1024;
  std::unique_ptr<HttpServer> server = StartLoopback(options);
  ASSERT_NE(server, nullptr);
  std::atomic<int> calls{0};
  server->Handle("POST", "/upload", [&calls](const HttpRequest&) {
    ++calls;
    return Json("{}");
  });
  const int port = server->port();

  EXPECT_EQ(Send(port, "POST", "/upload", std::string(1024, 'x'))->status, 200);
  absl::StatusOr<ClientResponse> big =
      Send(port, "POST", "/upload", std::string(1025, 'x'));
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->status, 413);
  EXPECT_THAT(big->body, HasSubstr("exceeds 1024 bytes"));

  // Declared length alone is enough to refuse; the body is never sent, and
  // the answer comes without waiting for it (RawStatus gives up after 10 s,
  // the server's read timeout is 30 s).
  absl::StatusOr<int> declared =
      RawStatus(port,
                "POST /upload HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                "Content-Length: 1073741824\r\n\r\n");
  ASSERT_TRUE(declared.ok()) << declared.status();
  EXPECT_EQ(*declared, 413);

  // Without a declared length, the limit applies while reading.
  absl::StatusOr<ClientResponse> streamed =
      SendChunked(port, "/upload", std::string(1536, 'y'));
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_EQ(streamed->status, 413);

  // A body well over the limit still gets its answer, not a reset.
  absl::StatusOr<ClientResponse> large =
      Send(port, "POST", "/upload", std::string(300000, 'x'));
  ASSERT_TRUE(large.ok()) << large.status();
  EXPECT_EQ(large->status, 413);

  // A gzip body counts as what it decodes to: 64 KiB of 'z' compress to
  // about 100 bytes but exceed the limit once inflated.
  ClientOptions gzip;
  gzip.gzip = true;
  absl::StatusOr<ClientResponse> inflated =
      Send(port, "POST", "/upload", std::string(64 << 10, 'z'), {}, gzip);
  ASSERT_TRUE(inflated.ok()) << inflated.status();
  EXPECT_EQ(inflated->status, 413);
  EXPECT_EQ(calls.load(), 1);
}

TEST(HttpServer, BusyPortIsAStatusNamingTheAddress) {
  std::unique_ptr<HttpServer> first = StartLoopback();
  ASSERT_NE(first, nullptr);
  absl::StatusOr<std::unique_ptr<HttpServer>> second =
      HttpServer::Start(kLoopback, first->port(), 1);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat(kLoopback, ":", first->port())));
  EXPECT_THAT(second.status().message(), HasSubstr("in use"));
  // The first server is unaffected.
  first->Handle("GET", "/ok", [](const HttpRequest&) { return Json("ok"); });
  EXPECT_EQ(Send(first->port(), "GET", "/ok")->body, "ok");
}

TEST(HttpServer, RejectsInvalidOptions) {
  EXPECT_EQ(HttpServer::Start("localhost", 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HttpServer::Start(kLoopback, -1, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HttpServer::Start(kLoopback, 65536, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HttpServer::Start(kLoopback, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

int OpenFdCount() {
  int count = 0;
  for (int fd = 0; fd < 4096; ++fd) {
    if (fcntl(fd, F_GETFD) != -1) ++count;
  }
  return count;
}

TEST(HttpServer, StopIsIdempotentAndClosesThePort) {
  const int fds_before = OpenFdCount();
  std::unique_ptr<HttpServer> server = StartLoopback();
  ASSERT_NE(server, nullptr);
  server->Handle("GET", "/ok", [](const HttpRequest&) { return Json("ok"); });
  const int port = server->port();
  EXPECT_EQ(Send(port, "GET", "/ok")->status, 200);
  const absl::Time stop_start = absl::Now();
  server->Stop();
  // Generous: the accept loop wakes at once; a loaded machine may lag.
  EXPECT_LT(absl::Now() - stop_start, absl::Seconds(5));
  server->Stop();
  EXPECT_EQ(Send(port, "GET", "/ok").status().code(),
            absl::StatusCode::kUnavailable);
  server.reset();                        // the destructor stops again
  EXPECT_EQ(OpenFdCount(), fds_before);  // nothing leaked
}

// The accept-queue limit of the IPv4 TCP socket listening on `port`, as
// the kernel reports it (sock_diag: idiag_wqueue of a listening socket is
// its backlog), or -1 when none is found.
int ListenBacklog(int port) {
  const int fd =
      socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0) return -1;
  struct {
    nlmsghdr header;
    inet_diag_req_v2 request;
  } ask{};
  ask.header.nlmsg_len = sizeof(ask);
  ask.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  ask.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  ask.request.sdiag_family = AF_INET;
  ask.request.sdiag_protocol = IPPROTO_TCP;
  ask.request.idiag_states = 1u << TCP_LISTEN;
  int backlog = -1;
  if (send(fd, &ask, sizeof(ask), 0) == static_cast<ssize_t>(sizeof(ask))) {
    alignas(nlmsghdr) char buffer[16384];
    for (bool done = false; !done;) {
      ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
      if (n <= 0) break;
      for (auto* h = reinterpret_cast<nlmsghdr*>(buffer); NLMSG_OK(h, n);
           h = NLMSG_NEXT(h, n)) {
        if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR) {
          done = true;
          break;
        }
        const auto* m = static_cast<const inet_diag_msg*>(NLMSG_DATA(h));
        if (ntohs(m->id.idiag_sport) == port) {
          backlog = static_cast<int>(m->idiag_wqueue);
        }
      }
    }
  }
  close(fd);
  return backlog;
}

// Many clients connecting at once wait in the kernel's accept queue
// instead of losing their SYNs: Debian's httplib listens with a backlog
// of 5, which the server raises.
TEST(HttpServer, ListensWithARoomyAcceptQueue) {
  std::unique_ptr<HttpServer> server = StartLoopback();
  ASSERT_NE(server, nullptr);
  EXPECT_GE(ListenBacklog(server->port()), 128);
  server->Handle("GET", "/ok", [](const HttpRequest&) { return Json("ok"); });
  EXPECT_EQ(Send(server->port(), "GET", "/ok")->body, "ok");
}

TEST(HttpServer, ServesConcurrentClients) {
  HttpServerOptions options;
  options.threads = 4;
  std::unique_ptr<HttpServer> server = StartLoopback(options);
  ASSERT_NE(server, nullptr);
  std::atomic<int> served{0};
  server->Handle("GET", "/count", [&served](const HttpRequest&) {
    return Json(std::to_string(++served));
  });
  constexpr int kClients = 4;
  constexpr int kRequests = 25;
  std::atomic<int> ok{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&] {
      for (int i = 0; i < kRequests; ++i) {
        absl::StatusOr<ClientResponse> r =
            Send(server->port(), "GET", "/count");
        if (r.ok() && r->status == 200) ++ok;
      }
    });
  }
  for (std::thread& client : clients) client.join();
  EXPECT_EQ(ok.load(), kClients * kRequests);
  EXPECT_EQ(served.load(), kClients * kRequests);
}

// The process-wide stack-size floor that civetweb's 100 KiB threads needed
// is gone: handlers must run on threads with room for a worker's static TLS
// (about 170 KiB with cuBLAS and OpenBLAS) and deep recursion such as the
// REST gateway's 32-level JSON parse.
TEST(HttpServer, HandlersRunOnThreadsWithFullSizedStacks) {
  std::unique_ptr<HttpServer> server = StartLoopback();
  ASSERT_NE(server, nullptr);
  server->Handle("GET", "/stack", [](const HttpRequest&) {
    pthread_attr_t attr;
    size_t size = 0;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      pthread_attr_getstacksize(&attr, &size);
      pthread_attr_destroy(&attr);
    }
    return Json(std::to_string(size));
  });
  absl::StatusOr<ClientResponse> r = Send(server->port(), "GET", "/stack");
  ASSERT_TRUE(r.ok()) << r.status();
  size_t size = 0;
  ASSERT_TRUE(absl::SimpleAtoi(r->body, &size)) << r->body;
  EXPECT_GE(size, size_t{1} << 20);
}

class HttpsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/pipetrain-https-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    absl::StatusOr<TestPki> pki = TestPki::Create(dir_, "test-ca");
    ASSERT_TRUE(pki.ok()) << pki.status();
    absl::StatusOr<CertFiles> cert = pki->Issue("pipetrain-scheduler");
    ASSERT_TRUE(cert.ok()) << cert.status();
    cert_ = *cert;
    HttpServerOptions options;
    options.host = kLoopback;
    options.tls_cert_file = cert_.cert;
    options.tls_key_file = cert_.key;
    absl::StatusOr<std::unique_ptr<HttpServer>> server =
        HttpServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    server_->Handle("POST", "/echo",
                    [](const HttpRequest& r) { return Json(r.body); });
    tls_.ca_file = cert_.ca;
  }
  void TearDown() override {
    server_.reset();
    std::system(absl::StrCat("rm -rf ", dir_).c_str());
  }

  std::string dir_;
  CertFiles cert_;
  std::unique_ptr<HttpServer> server_;
  ClientOptions tls_;
};

TEST_F(HttpsServerTest, ServesRoutesOverTlsVerifiedAgainstTheCa) {
  EXPECT_TRUE(server_->https());
  MetricsRegistry registry;
  (*registry.GetCounter("pipetrain_test_requests_total", "Requests."))
      ->Increment(2);
  ServeMetrics(server_.get(), &registry);
  absl::StatusOr<ClientResponse> metrics =
      Send(server_->port(), "GET", "/metrics", "", {}, tls_);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(metrics->status, 200);
  EXPECT_EQ(metrics->headers["content-type"], kPrometheusTextContentType);
  EXPECT_EQ(metrics->body, registry.RenderText());

  absl::StatusOr<ClientResponse> echo =
      Send(server_->port(), "POST", "/echo", "{\"a\": 1}", {}, tls_);
  ASSERT_TRUE(echo.ok()) << echo.status();
  EXPECT_EQ(echo->body, "{\"a\": 1}");
  absl::StatusOr<ClientResponse> missing =
      Send(server_->port(), "GET", "/nope", "", {}, tls_);
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_EQ(missing->status, 404);
}

TEST_F(HttpsServerTest, PlaintextAndUntrustedClientsGetNoAnswer) {
  // Plain HTTP to the HTTPS port: the handshake fails and the connection
  // is closed; no HTTP response comes back.
  absl::StatusOr<ClientResponse> plain =
      Send(server_->port(), "POST", "/echo", "{}");
  EXPECT_FALSE(plain.ok());
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kUnavailable);
  // A client that trusts another CA refuses the server's certificate.
  absl::StatusOr<TestPki> other = TestPki::Create(dir_, "other-ca");
  ASSERT_TRUE(other.ok()) << other.status();
  ClientOptions wrong_ca;
  wrong_ca.ca_file = other->ca_file();
  absl::StatusOr<ClientResponse> untrusted =
      Send(server_->port(), "POST", "/echo", "{}", {}, wrong_ca);
  EXPECT_FALSE(untrusted.ok());
  // The server still serves a good client afterwards.
  absl::StatusOr<ClientResponse> good =
      Send(server_->port(), "POST", "/echo", "{}", {}, tls_);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->status, 200);
}

TEST_F(HttpsServerTest, BadCertificateOrKeyIsAnInvalidArgument) {
  HttpServerOptions options;
  options.host = kLoopback;
  options.tls_cert_file = cert_.cert;
  EXPECT_EQ(HttpServer::Start(options).status().code(),
            absl::StatusCode::kInvalidArgument);  // no key
  options.tls_key_file = dir_ + "/missing.key";
  absl::StatusOr<std::unique_ptr<HttpServer>> missing =
      HttpServer::Start(options);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("missing.key"));
  options.tls_cert_file = cert_.ca;  // the CA's certificate, not the key's
  options.tls_key_file = cert_.key;
  absl::StatusOr<std::unique_ptr<HttpServer>> mismatched =
      HttpServer::Start(options);
  EXPECT_EQ(mismatched.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mismatched.status().message(), HasSubstr("private key"));
}

}  // namespace
}  // namespace pipetrain
