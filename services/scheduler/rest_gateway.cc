#include "services/scheduler/rest_gateway.h"

#include <chrono>
#include <functional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "spec/job_spec.h"

namespace pipetrain {
namespace {

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

HttpResponse ErrorResponse(const absl::Status& status) {
  HttpResponse r;
  r.status = HttpStatusFor(status.code());
  r.body =
      absl::StrCat("{\"error\":{\"code\":", r.status, ",\"status\":\"",
                   absl::StatusCodeToString(status.code()), "\",\"message\":\"",
                   JsonEscape(std::string(status.message())), "\"}}");
  return r;
}

HttpResponse JsonResponse(const google::protobuf::Message& msg) {
  HttpResponse r;
  r.body = ToApiJson(msg);
  return r;
}

// One REST request and what serves it.
struct RestCall {
  SchedulerCore* core;
  ControlCallMetrics* metrics;
  const ApiAuthorizer* auth;
  const HttpRequest& request;
};

// The caller may call `method` (the access table's name for the route);
// refusals are recorded and logged with the peer, never the token.
absl::Status Authorize(const RestCall& c, const char* method) {
  auto header = c.request.headers.find("authorization");
  const absl::Status allowed = c.auth->Authorize(
      header == c.request.headers.end() ? "" : header->second, method);
  if (!allowed.ok()) {
    PT_LOG(WARNING) << "REST " << method << " refused: " << allowed.message();
    c.metrics->Record(method, "rest", 0, allowed);
  }
  return allowed;
}

// Authorizes, times a call, records it, and turns its result into a
// response. `call` parses the body, so an unauthorized caller learns
// nothing from parse errors.
template <typename Resp>
HttpResponse Respond(const RestCall& c, const char* method,
                     const std::function<absl::StatusOr<Resp>()>& call) {
  const absl::Status allowed = Authorize(c, method);
  if (!allowed.ok()) return ErrorResponse(allowed);
  ControlCallMetrics* metrics = c.metrics;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<Resp> result = call();
  metrics->Record(
      method, "rest",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count(),
      result.status());
  if (!result.ok()) return ErrorResponse(result.status());
  return JsonResponse(*result);
}

// A body may be empty (no fields) or a JSON object of `msg`'s fields.
absl::Status ParseBody(const std::string& body,
                       google::protobuf::Message* msg) {
  if (body.find_first_not_of(" \t\r\n") == std::string::npos) {
    return absl::OkStatus();
  }
  return ParseJson(body, msg);
}

// "/{id}" or "/{id}/tail" or "/{id}:action" after a route's prefix
// ("/v1/jobs", "/v1/workers").
struct ResourcePath {
  std::string id;
  std::string tail;    // "plan", "versions" or ""
  std::string action;  // "pause", ... or ""
};

absl::StatusOr<ResourcePath> ParseResourcePath(const std::string& rest) {
  ResourcePath p;
  std::string s = rest;
  if (!s.empty() && s[0] == '/') s = s.substr(1);
  const size_t slash = s.find('/');
  if (slash != std::string::npos) {
    p.tail = s.substr(slash + 1);
    s = s.substr(0, slash);
  }
  const size_t colon = s.find(':');
  if (colon != std::string::npos) {
    p.action = s.substr(colon + 1);
    s = s.substr(0, colon);
  }
  p.id = s;
  if (p.id.empty() && (!p.tail.empty() || !p.action.empty())) {
    return absl::InvalidArgumentError("missing id in the path");
  }
  return p;
}

int64_t QueryInt(const std::string& query, const std::string& key) {
  for (absl::string_view part : absl::StrSplit(query, '&')) {
    std::pair<std::string, std::string> kv = absl::StrSplit(part, '=');
    int64_t v = 0;
    if ((kv.first == key) && absl::SimpleAtoi(kv.second, &v)) return v;
  }
  return 0;
}

HttpResponse NotFound(const std::string& path) {
  return ErrorResponse(absl::NotFoundError(absl::StrCat("no route ", path)));
}

HttpResponse GetJobs(const RestCall& m) {
  SchedulerCore* core = m.core;
  const HttpRequest& req = m.request;
  auto path =
      ParseResourcePath(req.path.substr(std::string("/v1/jobs").size()));
  if (!path.ok()) return ErrorResponse(path.status());
  if (path->id.empty()) {
    return Respond<v1::ListJobsResponse>(
        m, "ListJobs", [&] { return core->ListJobs(v1::ListJobsRequest()); });
  }
  if (!path->action.empty()) return NotFound(req.path);
  if (path->tail.empty()) {
    v1::GetJobRequest r;
    r.set_job_id(path->id);
    return Respond<v1::Job>(m, "GetJob", [&] { return core->GetJob(r); });
  }
  if (path->tail == "plan") {
    v1::GetPlanRequest r;
    r.set_job_id(path->id);
    return Respond<v1::Plan>(m, "GetPlan", [&] { return core->GetPlan(r); });
  }
  if (path->tail == "trace") {
    // The body is the Chrome trace itself, ready for chrome://tracing.
    v1::GetJobTraceRequest r;
    r.set_job_id(path->id);
    r.set_last_steps(QueryInt(req.query, "last_steps"));
    const absl::Status allowed = Authorize(m, "GetJobTrace");
    if (!allowed.ok()) return ErrorResponse(allowed);
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<v1::GetJobTraceResponse> trace = core->GetJobTrace(r);
    m.metrics->Record(
        "GetJobTrace", "rest",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count(),
        trace.status());
    if (!trace.ok()) return ErrorResponse(trace.status());
    HttpResponse response;
    response.body = trace->chrome_trace_json();
    return response;
  }
  if (path->tail == "versions") {
    v1::GetVersionsRequest r;
    r.set_job_id(path->id);
    r.set_since_step(QueryInt(req.query, "since_step"));
    return Respond<v1::GetVersionsResponse>(
        m, "GetVersions", [&] { return core->GetVersions(r); });
  }
  if (path->tail == "model") {
    // The body is the safetensors file itself.
    v1::ExportModelRequest r;
    r.set_job_id(path->id);
    r.set_version(QueryInt(req.query, "version"));
    const absl::Status allowed = Authorize(m, "ExportModel");
    if (!allowed.ok()) return ErrorResponse(allowed);
    HttpResponse response;
    response.content_type = "application/octet-stream";
    const auto start = std::chrono::steady_clock::now();
    const absl::Status exported =
        core->ExportModel(r, [&response](absl::string_view piece) {
          response.body.append(piece.data(), piece.size());
          return absl::OkStatus();
        });
    m.metrics->Record(
        "ExportModel", "rest",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count(),
        exported);
    if (!exported.ok()) return ErrorResponse(exported);
    return response;
  }
  if (path->tail == "checkpoints") {
    v1::ListCheckpointsRequest r;
    r.set_job_id(path->id);
    return Respond<v1::ListCheckpointsResponse>(
        m, "ListCheckpoints", [&] { return core->ListCheckpoints(r); });
  }
  return NotFound(req.path);
}

HttpResponse PostJobs(const RestCall& m) {
  SchedulerCore* core = m.core;
  const HttpRequest& req = m.request;
  auto path =
      ParseResourcePath(req.path.substr(std::string("/v1/jobs").size()));
  if (!path.ok()) return ErrorResponse(path.status());
  if (path->id.empty()) {
    return Respond<v1::Job>(m, "SubmitJob", [&]() -> absl::StatusOr<v1::Job> {
      // A whole JobSpec or a bare TrainingSpec, as pipetrainctl reads files.
      v1::SubmitJobRequest r;
      ASSIGN_OR_RETURN(*r.mutable_spec(), ParseJobSpecJson(req.body));
      return core->SubmitJob(r);
    });
  }
  if (!path->tail.empty()) return NotFound(req.path);
  v1::JobActionRequest action;
  action.set_job_id(path->id);
  if (path->action == "pause") {
    return Respond<v1::Job>(m, "PauseJob",
                            [&] { return core->PauseJob(action); });
  }
  if (path->action == "resume") {
    return Respond<v1::Job>(m, "ResumeJob",
                            [&] { return core->ResumeJob(action); });
  }
  if (path->action == "cancel") {
    return Respond<v1::Job>(m, "CancelJob",
                            [&] { return core->CancelJob(action); });
  }
  if (path->action == "evaluate") {
    return Respond<v1::EvalResult>(m, "Evaluate",
                                   [&]() -> absl::StatusOr<v1::EvalResult> {
                                     v1::EvaluateRequest r;
                                     RETURN_IF_ERROR(ParseBody(req.body, &r));
                                     r.set_job_id(path->id);
                                     return core->Evaluate(r);
                                   });
  }
  if (path->action == "checkpoint") {
    v1::CheckpointJobRequest r;
    r.set_job_id(path->id);
    return Respond<v1::CheckpointJobResponse>(
        m, "CheckpointJob", [&] { return core->CheckpointJob(r); });
  }
  return ErrorResponse(absl::NotFoundError(absl::StrCat(
      "unknown action '", path->action,
      "' (want :pause, :resume, :cancel, :evaluate or :checkpoint)")));
}

}  // namespace

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

void InstallRestGateway(HttpServer* http, SchedulerCore* core,
                        ControlCallMetrics* metrics,
                        const ApiAuthorizer* auth) {
  http->Handle("GET", "/v1/jobs", [=](const HttpRequest& r) {
    return GetJobs(RestCall{core, metrics, auth, r});
  });
  http->Handle("POST", "/v1/jobs", [=](const HttpRequest& r) {
    return PostJobs(RestCall{core, metrics, auth, r});
  });
  http->Handle("GET", "/v1/workers", [=](const HttpRequest& r) {
    if (r.path != "/v1/workers") return NotFound(r.path);
    return Respond<v1::ListWorkersResponse>(
        RestCall{core, metrics, auth, r}, "ListWorkers",
        [&] { return core->ListWorkers(v1::ListWorkersRequest()); });
  });
  http->Handle("DELETE", "/v1/workers/", [=](const HttpRequest& r) {
    // The route's prefix also matches "/v1/workers" itself; only
    // "/v1/workers/ID" names a worker.
    auto path =
        ParseResourcePath(r.path.substr(std::string("/v1/workers").size()));
    if (!path.ok() || path->id.empty() || !path->tail.empty() ||
        !path->action.empty()) {
      return NotFound(r.path);
    }
    v1::RemoveWorkerRequest q;
    q.set_worker_id(path->id);
    return Respond<v1::RemoveWorkerResponse>(
        RestCall{core, metrics, auth, r}, "RemoveWorker",
        [&] { return core->RemoveWorker(q); });
  });
}

void ServeMetricsWithAuth(HttpServer* http, const MetricsRegistry* registry,
                          ControlCallMetrics* metrics,
                          const ApiAuthorizer* auth) {
  http->Handle("GET", "/metrics", [=](const HttpRequest& r) {
    const absl::Status allowed =
        Authorize(RestCall{nullptr, metrics, auth, r}, "Metrics");
    if (!allowed.ok()) return ErrorResponse(allowed);
    HttpResponse response;
    response.content_type = kPrometheusTextContentType;
    response.body = registry->RenderText();
    return response;
  });
}

}  // namespace pipetrain
