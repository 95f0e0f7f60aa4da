// pipetrainctl's connection to the scheduler: the user calls of
// SchedulerService as blocking unary calls, each with a deadline, returning
// absl::StatusOr. The only file of the CLI that sees gRPC.
//
// Not thread-safe: owned by the CLI's main thread.
#ifndef PIPETRAIN_SERVICES_CTL_SCHEDULER_CLIENT_H_
#define PIPETRAIN_SERVICES_CTL_SCHEDULER_CLIENT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "pipetrain/v1/scheduler.grpc.pb.h"

namespace pipetrain {
namespace ctl {

class SchedulerClient {
 public:
  // Connects lazily (the first call dials `target`); never fails here.
  // Every call carries `token` as "authorization: Bearer TOKEN" when it is
  // not empty.
  SchedulerClient(const std::string& target, double timeout_seconds,
                  std::string token = "");

  const std::string& target() const { return target_; }
  double timeout_seconds() const { return timeout_seconds_; }
  // Whether the channel is connected now: after a failed call, tells a
  // scheduler that answered from one that could not be reached.
  bool Connected() const;

  absl::StatusOr<v1::Job> SubmitJob(const v1::JobSpec& spec);
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id);
  absl::StatusOr<v1::ListJobsResponse> ListJobs();
  absl::StatusOr<v1::Job> PauseJob(const std::string& job_id);
  absl::StatusOr<v1::Job> ResumeJob(const std::string& job_id);
  absl::StatusOr<v1::Job> CancelJob(const std::string& job_id);
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers();
  absl::StatusOr<v1::Plan> GetPlan(const std::string& job_id);
  absl::StatusOr<v1::GetVersionsResponse> GetVersions(const std::string& job_id,
                                                      int64_t since_step);
  // Evaluation runs the held-out split through the pipeline, so its
  // deadline is at least kEvaluateMinSeconds.
  absl::StatusOr<v1::EvalResult> Evaluate(const std::string& job_id,
                                          int64_t max_samples);

  static constexpr double kEvaluateMinSeconds = 300;
  absl::StatusOr<v1::GetJobTraceResponse> GetJobTrace(const std::string& job_id,
                                                      int64_t last_steps);
  absl::StatusOr<v1::ListCheckpointsResponse> ListCheckpoints(
      const std::string& job_id);
  absl::StatusOr<v1::CheckpointJobResponse> CheckpointJob(
      const std::string& job_id);
  absl::StatusOr<v1::RemoveWorkerResponse> RemoveWorker(
      const std::string& worker_id);
  // The model export of checkpoint `version` (0: the latest), whole.
  absl::StatusOr<std::string> ExportModel(const std::string& job_id,
                                          int64_t version);

 private:
  template <typename Response>
  using Rpc =
      std::function<grpc::Status(grpc::ClientContext*, Response* response)>;

  // Runs one call with a deadline `seconds` from now.
  template <typename Response>
  absl::StatusOr<Response> Call(const Rpc<Response>& rpc, double seconds);

  // Constant after construction.
  const std::string target_;
  const double timeout_seconds_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::SchedulerService::Stub> stub_;
  const std::string token_;  // never logged
};

}  // namespace ctl
}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_CTL_SCHEDULER_CLIENT_H_
