#include "services/worker/link_prober.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/elapsed.h"
#include "common/logging.h"
#include "common/median.h"
#include "common/status_macros.h"
#include "services/rpc/grpc_util.h"

namespace pipetrain {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One Probe call carrying `payload` bytes; its wall time in seconds.
absl::StatusOr<double> TimedProbe(v1::StageService::StubInterface& stub,
                                  const v1::ProbeTarget& target,
                                  const std::string& payload,
                                  double deadline_seconds) {
  v1::ProbeRequest request;
  request.set_payload(payload);
  v1::ProbeResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(deadline_seconds));
  const auto start = Clock::now();
  const grpc::Status status = stub.Probe(&ctx, request, &response);
  const double seconds = Since(start);
  if (!status.ok()) {
    const absl::Status error = FromGrpcStatus(status);
    return absl::Status(
        error.code(),
        absl::StrCat("probing worker ", target.worker_id(), " at ",
                     target.address(), ": ", error.message()));
  }
  if (response.received_bytes() != static_cast<int64_t>(payload.size())) {
    return absl::DataLossError(absl::StrCat(
        "probing worker ", target.worker_id(), ": it received ",
        response.received_bytes(), " of ", payload.size(), " bytes"));
  }
  return seconds;
}

struct RoundTrips {
  double median_seconds = 0;
  // This process's CPU per call: the median over batches of
  // kCpuBatchCalls calls (the whole run when shorter), so that a batch in
  // which another thread of the process did work of its own sways it less.
  double cpu_seconds_per_call = 0;
};

constexpr int kCpuBatchCalls = 10;

// `options.rtt_calls` empty calls, after one that connects (and does the
// TLS handshake) outside the figures.
absl::StatusOr<RoundTrips> TimedRoundTrips(
    v1::StageService::StubInterface& stub, const v1::ProbeTarget& target,
    const LinkProbeOptions& options) {
  const double deadline = options.call_deadline_seconds;
  RETURN_IF_ERROR(TimedProbe(stub, target, "", deadline).status());
  std::vector<double> rtts;
  std::vector<double> cpu_per_call;
  const int calls = std::max(1, options.rtt_calls);
  const int batch = std::min(calls, kCpuBatchCalls);
  double batch_start = ProcessCpuSeconds();
  for (int i = 1; i <= calls; ++i) {
    ASSIGN_OR_RETURN(const double t, TimedProbe(stub, target, "", deadline));
    rtts.push_back(t);
    if (i % batch == 0) {
      const double now = ProcessCpuSeconds();
      cpu_per_call.push_back((now - batch_start) / batch);
      batch_start = now;
    }
  }
  return RoundTrips{Median(rtts), Median(cpu_per_call)};
}

absl::StatusOr<double> MedianRtt(v1::StageService::StubInterface& stub,
                                 const v1::ProbeTarget& target,
                                 const LinkProbeOptions& options) {
  ASSIGN_OR_RETURN(const RoundTrips trips,
                   TimedRoundTrips(stub, target, options));
  return trips.median_seconds;
}

}  // namespace

absl::StatusOr<MessageCost> MeasureMessageCost(
    const std::string& own_address, const LinkProbeOptions& options) {
  v1::ProbeTarget self;
  self.set_worker_id("itself");
  self.set_address(own_address);
  auto stub = v1::StageService::NewStub(CreatePipetrainChannel(own_address));
  ASSIGN_OR_RETURN(const RoundTrips trips,
                   TimedRoundTrips(*stub, self, options));
  // A round trip is four message ends: the request's sender and receiver,
  // the reply's sender and receiver, all in this process.
  return MessageCost{trips.median_seconds / 4, trips.cpu_seconds_per_call / 4};
}

absl::StatusOr<v1::LinkMeasurement> MeasureLinkWith(
    v1::StageService::StubInterface& stub, const v1::ProbeTarget& target,
    const LinkProbeOptions& options) {
  const double deadline = options.call_deadline_seconds;
  ASSIGN_OR_RETURN(const double rtt, MedianRtt(stub, target, options));

  const auto start = Clock::now();
  int64_t size = std::max<int64_t>(1, options.first_payload_bytes);
  // A big payload on a slow link takes longer than an empty call.
  auto limit = [&](int64_t bytes) { return deadline + bytes / 1e6; };
  // The first payload opens TCP's window: on a long link its transfer is
  // mostly slow start (1 MiB over 100 Mb/s and 100 ms: 15 Mb/s, the next
  // call 92), so it is not counted.
  bool window_open = false;
  int64_t total = 0;
  std::vector<double> at_final;  // bandwidths at the final size
  int extra = 0;
  while (true) {
    const std::string payload(static_cast<size_t>(size), '\0');
    ASSIGN_OR_RETURN(const double t,
                     TimedProbe(stub, target, payload, limit(size)));
    total += size;
    if (!window_open) {
      window_open = true;
      continue;
    }
    // A call faster than its RTT (jitter) still moved the bytes: floor the
    // transfer at a tenth of the call.
    const double transfer = std::max(t - rtt, 0.1 * t);
    const bool settled = transfer >= std::max(options.target_transfer_seconds,
                                              options.transfer_rtts * rtt) ||
                         size >= options.max_payload_bytes;
    const bool out_of_budget = total + size > options.max_total_bytes ||
                               Since(start) >= options.max_seconds;
    if (settled) {
      at_final.push_back(static_cast<double>(size) / transfer);
      if (extra++ >= options.bandwidth_calls || out_of_budget) break;
      continue;
    }
    if (out_of_budget) {
      at_final.push_back(static_cast<double>(size) / transfer);
      break;
    }
    size = std::min(size * 2, options.max_payload_bytes);
  }
  v1::LinkMeasurement out;
  out.set_to_worker_id(target.worker_id());
  out.set_rtt_seconds(rtt);
  out.set_bandwidth_bytes_per_s(Median(at_final));
  out.set_measured_unix_ms(absl::ToUnixMillis(absl::Now()));
  out.set_source("probe");
  return out;
}

absl::StatusOr<v1::LinkMeasurement> MeasureLink(
    const v1::ProbeTarget& target, const LinkProbeOptions& options) {
  if (target.address().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("probe target ", target.worker_id(), " has no address"));
  }
  auto stub =
      v1::StageService::NewStub(CreatePipetrainChannel(target.address()));
  return MeasureLinkWith(*stub, target, options);
}

LinkProber::LinkProber(LinkProbeOptions options)
    : options_(std::move(options)) {
  thread_ = std::thread([this] { Loop(); });
}

LinkProber::~LinkProber() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void LinkProber::Enqueue(const std::vector<v1::ProbeTarget>& targets) {
  absl::MutexLock lock(&mu_);
  for (const v1::ProbeTarget& t : targets) {
    const bool queued =
        t.worker_id() == running_ ||
        std::any_of(queue_.begin(), queue_.end(), [&](const auto& q) {
          return q.worker_id() == t.worker_id();
        });
    if (!queued) queue_.push_back(t);
  }
}

std::vector<v1::LinkMeasurement> LinkProber::Take() {
  absl::MutexLock lock(&mu_);
  return std::exchange(done_, {});
}

void LinkProber::Return(std::vector<v1::LinkMeasurement> links) {
  absl::MutexLock lock(&mu_);
  for (v1::LinkMeasurement& l : links) done_.push_back(std::move(l));
}

void LinkProber::Loop() {
  while (true) {
    v1::ProbeTarget target;
    {
      absl::MutexLock lock(&mu_);
      running_.clear();
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      target = std::move(queue_.front());
      queue_.pop_front();
      running_ = target.worker_id();
    }
    absl::StatusOr<v1::LinkMeasurement> measured =
        MeasureLink(target, options_);
    absl::MutexLock lock(&mu_);
    if (measured.ok()) {
      PT_LOG(INFO) << "link to " << target.worker_id() << ": "
                   << measured->bandwidth_bytes_per_s() * 8e-6 << " Mb/s, RTT "
                   << measured->rtt_seconds() * 1e3 << " ms";
      done_.push_back(*std::move(measured));
    } else {
      PT_LOG(WARNING) << measured.status();
    }
  }
}

}  // namespace pipetrain
