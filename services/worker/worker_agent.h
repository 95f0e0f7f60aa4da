// WorkerAgent: a worker's link to the scheduler. It registers the worker
// (address, device, memory, measured GEMM speed, labels) and heartbeats at
// the interval the scheduler asks for, carrying the stage's report (state,
// versions, step results since the last acknowledged heartbeat). It
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
  // The configuration (job, attempt) reported last and the step its next
  // report's results start at; a new configuration (a new job, or the same
  // job resumed after a recovery) is reported from its first result.
  std::string reported_job_;
  int64_t reported_attempt_ = -1;
  int64_t reported_since_ = 0;
  // HeartbeatResponse.scheduler_instance last seen: when it changes, the
  // stage's results are reported again from the first.
  std::string scheduler_instance_;

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_WORKER_WORKER_AGENT_H_
