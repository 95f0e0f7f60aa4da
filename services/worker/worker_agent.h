// WorkerAgent: a worker's link to the scheduler. It registers the worker
// (address, device, memory, measured GEMM speed, labels) and heartbeats at
// the interval the scheduler asks for, carrying the stage's report (state,
// versions, and the step results the scheduler has not yet written down:
// ReportCursor). It
// re-registers when the scheduler has forgotten the worker (e.g. restarted
// without its data) and keeps retrying while the scheduler is away.
// Links the scheduler asks it to measure (HeartbeatResponse.probe) are
// measured by its LinkProber on a thread of their own and reported in a
// later heartbeat (HeartbeatRequest.links), so probes never delay one.
//
// Thread-safe; owns one thread.
#ifndef PIPETRAIN_SERVICES_WORKER_WORKER_AGENT_H_
#define PIPETRAIN_SERVICES_WORKER_WORKER_AGENT_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "pipetrain/v1/scheduler.grpc.pb.h"
#include "services/worker/link_prober.h"
#include "services/worker/report_cursor.h"
#include "worker/pipeline/stage_host.h"

namespace pipetrain {

class WorkerAgent {
 public:
  // `host` is borrowed and must outlive the agent. `join_token` is the
  // cluster's (--join_token_file), empty when it has none.
  WorkerAgent(const std::string& scheduler_address, v1::WorkerInfo info,
              const StageHost* host, std::string join_token = "");
  ~WorkerAgent();

 private:
  void Loop();
  absl::Status Register();
  absl::Status Beat();

  const std::string scheduler_address_;
  const StageHost* const host_;  // borrowed
  const std::string join_token_;
  std::unique_ptr<v1::SchedulerService::Stub> stub_;
  LinkProber prober_;
  // Used only by the agent's thread.
  v1::WorkerInfo info_;
  double interval_s_ = 0.5;
  bool registered_ = false;
  // Proof of the last registration, sent with heartbeats; never logged.
  std::string secret_;
  // Which step results the next heartbeat carries.
  ReportCursor cursor_;

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_WORKER_WORKER_AGENT_H_
