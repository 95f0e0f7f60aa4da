// What the scheduler's logic needs from the outside world, as interfaces:
// driving stage workers (implemented over gRPC in services/, faked in
// tests) and the model code (spec validation and evaluation, implemented
// in services/ with the worker's CPU backend, so scheduler/ depends on
// neither gRPC nor the compute core).
#ifndef PIPETRAIN_SCHEDULER_INTERFACES_H_
#define PIPETRAIN_SCHEDULER_INTERFACES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipetrain/v1/scheduler.pb.h"
#include "pipetrain/v1/stage.pb.h"

namespace pipetrain {

// Calls to one stage worker at `address`. Implementations apply deadlines;
// calls block and are made from the scheduler's own threads, never from a
// network reaction. Thread-safe.
class StageControl {
 public:
  virtual ~StageControl() = default;
  virtual absl::StatusOr<v1::ProfileResponse> Profile(
      const std::string& address, const v1::ProfileRequest& request) = 0;
  virtual absl::StatusOr<v1::ConfigureResponse> Configure(
      const std::string& address, const v1::StageConfig& config) = 0;
  // Returns the target in force (see TrainRequest).
  virtual absl::StatusOr<int64_t> Train(const std::string& address,
                                        const std::string& job_id,
                                        int64_t until_step) = 0;
  virtual absl::Status Stop(const std::string& address,
                            const std::string& job_id) = 0;
  virtual absl::StatusOr<v1::GetWeightsResponse> GetWeights(
      const std::string& address, const std::string& job_id) = 0;
  virtual absl::StatusOr<v1::GetTraceResponse> GetTrace(
      const std::string& address, const std::string& job_id,
      int64_t since_step) = 0;
};

// The model code the scheduler relies on. Thread-safe.
class ModelSupport {
 public:
  virtual ~ModelSupport() = default;
  // InvalidArgument naming the field when the spec cannot train.
  virtual absl::Status Validate(const v1::TrainingSpec& spec) = 0;
  // The idle fraction the job's schedule has in theory on `num_stages`
  // stages with uniform costs (e.g. (K - 1) / (M + K - 1) for GPipe).
  virtual double TheoreticalBubble(const v1::JobSpec& spec, int num_stages) = 0;
  // Loss and accuracy of a model with these weights (every stage's, in
  // layer order) on the spec's held-out split.
  virtual absl::StatusOr<v1::EvalResult> Evaluate(
      const v1::TrainingSpec& spec, const std::vector<v1::TensorProto>& weights,
      int64_t max_samples) = 0;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_INTERFACES_H_
