// The one-line message pipetrainctl prints when a scheduler call fails.
// Pure; thread-safe.
#ifndef PIPETRAIN_SERVICES_CTL_RPC_FAILURE_H_
#define PIPETRAIN_SERVICES_CTL_RPC_FAILURE_H_

#include <string>

#include "absl/status/status.h"

namespace pipetrain {
namespace ctl {

struct RpcFailureContext {
  // The --scheduler address.
  std::string target;
  // The job the command names; empty when it names none.
  std::string job_id;
  // Whether the channel was connected when the call failed: an UNAVAILABLE
  // or DEADLINE_EXCEEDED the scheduler itself sent is not "cannot reach".
  bool connected = false;
  double timeout_seconds = 0;
};

// Without the "pipetrainctl: " prefix, on one line, e.g.
//   cannot reach the scheduler at localhost:7000 (is pipetrain-scheduler
//   running? set --scheduler or PIPETRAIN_SCHEDULER)
//   no job 'job-9'
//   job job-3 is COMPLETED (failed precondition)
std::string DescribeRpcFailure(const absl::Status& status,
                               const RpcFailureContext& context);

}  // namespace ctl
}  // namespace pipetrain

#endif  // PIPETRAIN_SERVICES_CTL_RPC_FAILURE_H_
