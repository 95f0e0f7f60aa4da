// WorkerAgent: a worker's link to the scheduler. It registers the worker
// (address, device, memory, measured GEMM speed, labels) and heartbeats at
// the interval the scheduler asks for, carrying the stage's report (state,
// versions, step results since the last acknowledged heartbeat). It
// re-registers when the scheduler has forgotten the worker (e.g. restarted
// without its data) and keeps retrying while the scheduler is away.
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
#include "worker/pipeline/stage_host.h"

namespace pipetrain {

class WorkerAgent {
 public:
  // `host` is borrowed and must outlive the agent.
  WorkerAgent(const std::string& scheduler_address, v1::WorkerInfo info,
              const StageHost* host);
  ~WorkerAgent();

 private:
  void Loop();
  absl::Status Register();
  absl::Status Beat();

  const std::string scheduler_address_;
  const StageHost* const host_;  // borrowed
  std::unique_ptr<v1::SchedulerService::Stub> stub_;
  // Used only by the agent's thread.
  v1::WorkerInfo info_;
  double interval_s_ = 0.5;
  bool registered_ = false;
  std::string reported_job_;
  int64_t reported_since_ = 0;

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_WORKER_WORKER_AGENT_H_
