#include "services/http/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
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
#include "services/http/loopback_http_client.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;
using testing_http::ClientResponse;
using testing_http::ConnectLoopback;
using testing_http::kLoopback;
using testing_http::RoundTrip;
using testing_http::Send;

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
           "X-Pipetrain-Test: yes\r\n");
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
  absl::StatusOr<ClientResponse> r = RoundTrip(
      server->port(),
      "POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
      "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n "
      "world\r\n0\r\n\r\n");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "hello world");
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

  // Declared length alone is enough to refuse; the body is never sent.
  absl::StatusOr<ClientResponse> declared = RoundTrip(
      port,
      "POST /upload HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
      "Content-Length: 1073741824\r\n\r\n");
  ASSERT_TRUE(declared.ok()) << declared.status();
  EXPECT_EQ(declared->status, 413);

  // Without a declared length, the limit applies while reading.
  std::string chunked =
      "POST /upload HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
      "Transfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 3; ++i) {
    absl::StrAppend(&chunked, "200\r\n", std::string(512, 'y'), "\r\n");
  }
  chunked += "0\r\n\r\n";
  absl::StatusOr<ClientResponse> streamed = RoundTrip(port, chunked);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_EQ(streamed->status, 413);
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
  // civetweb alone would take up to its 2 s poll quantum.
  EXPECT_LT(absl::Now() - stop_start, absl::Seconds(1));
  server->Stop();
  EXPECT_EQ(Send(port, "GET", "/ok").status().code(),
            absl::StatusCode::kUnavailable);
  server.reset();                        // the destructor stops again
  EXPECT_EQ(OpenFdCount(), fds_before);  // nothing leaked
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

}  // namespace
}  // namespace pipetrain
