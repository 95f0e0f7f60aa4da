// The scheduler's user calls as REST JSON on the process's HTTP server. Each
// route builds the call's request message (from the JSON body and the path),
// calls the same SchedulerCore method the gRPC service calls, and prints the
// response with protobuf's JSON mapping.
#ifndef PIPETRAIN_SERVICES_SCHEDULER_REST_GATEWAY_H_
#define PIPETRAIN_SERVICES_SCHEDULER_REST_GATEWAY_H_

#include "absl/status/status.h"
#include "scheduler/scheduler_core.h"
#include "services/auth/access_policy.h"
#include "services/http/http_server.h"
#include "services/scheduler/control_call_metrics.h"

namespace pipetrain {

// HTTP status for a Status code (Google API mapping).
int HttpStatusFor(absl::StatusCode code);

// Serves the user calls as REST JSON on `http`:
//   POST /v1/jobs                       SubmitJob (body: a JobSpec)
//   GET  /v1/jobs                       ListJobs
//   GET  /v1/jobs/{id}                  GetJob
//   POST /v1/jobs/{id}:pause|:resume|:cancel|:evaluate
//   GET  /v1/jobs/{id}/plan             GetPlan
//   GET  /v1/jobs/{id}/versions?since_step=N
//   GET  /v1/jobs/{id}/trace?last_steps=N   Chrome trace JSON
//   GET  /v1/workers                    ListWorkers
// Errors: {"error": {"code": <http>, "status": "NOT_FOUND", "message": ...}}.
// Every route is authorized by `auth` (borrowed; must outlive the routes)
// under its SchedulerService method name, with the "Authorization: Bearer
// TOKEN" header: 401 without a known token, 403 when its role is too weak.
void InstallRestGateway(HttpServer* http, SchedulerCore* core,
                        ControlCallMetrics* metrics, const ApiAuthorizer* auth);

// GET /metrics for `registry`, open to the viewer role ("Metrics").
void ServeMetricsWithAuth(HttpServer* http, const MetricsRegistry* registry,
                          ControlCallMetrics* metrics,
                          const ApiAuthorizer* auth);

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_SCHEDULER_REST_GATEWAY_H_
