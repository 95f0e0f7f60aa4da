// GrpcStageControl: the scheduler's StageControl over gRPC, one unary call
// per method with a deadline (state transfers: one stream each way, with a
// deadline sized for the bytes), statuses converted in services/rpc/grpc_util.
#ifndef PIPETRAIN_SERVICES_SCHEDULER_GRPC_STAGE_CONTROL_H_
#define PIPETRAIN_SERVICES_SCHEDULER_GRPC_STAGE_CONTROL_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "pipetrain/v1/stage.grpc.pb.h"
#include "scheduler/interfaces.h"

namespace pipetrain {

// Thread-safe; keeps one channel per worker address.
class GrpcStageControl final : public StageControl {
 public:
  absl::StatusOr<v1::ProfileResponse> Profile(
      const std::string& address, const v1::ProfileRequest& request) override;
  absl::StatusOr<v1::ConfigureResponse> Configure(
      const std::string& address, const v1::StageConfig& config) override;
  absl::StatusOr<int64_t> Train(const std::string& address,
                                const std::string& job_id,
                                int64_t until_step) override;
  absl::Status Stop(const std::string& address,
                    const std::string& job_id) override;
  absl::StatusOr<v1::EvalResult> Evaluate(const std::string& address,
                                          const std::string& job_id,
                                          int64_t max_samples) override;
  absl::StatusOr<v1::GetTraceResponse> GetTrace(const std::string& address,
                                                const std::string& job_id,
                                                int64_t since_step) override;
  absl::StatusOr<int64_t> Snapshot(const std::string& address,
                                   const std::string& job_id,
                                   int64_t step) override;
  absl::Status FetchSnapshot(const std::string& address,
                             const std::string& job_id, int64_t step,
                             const StageStateSink& sink) override;
  absl::StatusOr<int64_t> RestoreState(
      const std::string& address, const std::string& job_id,
      const StageStateInfo& info,
      const std::vector<StateTensor>& tensors) override;

 private:
  v1::StageService::Stub* StubFor(const std::string& address);
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<v1::StageService::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_SCHEDULER_GRPC_STAGE_CONTROL_H_
