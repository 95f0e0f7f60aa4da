#include "scheduler/worker_kinds.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace pipetrain {

bool SameWorkerKind(const v1::WorkerInfo& a, const v1::WorkerInfo& b) {
  if (a.device_kind() != b.device_kind() || a.device() != b.device()) {
    return false;
  }
  const double x = a.gemm_gflops();
  const double y = b.gemm_gflops();
  if (!(x > 0) || !(y > 0)) return !(x > 0) && !(y > 0);
  return std::max(x, y) <= kSameKindGemmSpread * std::min(x, y);
}

std::vector<std::vector<int>> GroupWorkerKinds(
    const std::vector<v1::WorkerInfo>& workers) {
  std::vector<std::vector<int>> kinds;
  for (int i = 0; i < static_cast<int>(workers.size()); ++i) {
    auto kind = std::find_if(kinds.begin(), kinds.end(), [&](const auto& k) {
      return SameWorkerKind(workers[k.front()], workers[i]);
    });
    if (kind == kinds.end()) {
      kinds.push_back({i});
    } else {
      kind->push_back(i);
    }
  }
  return kinds;
}

double ProfiledComputeSeconds(const v1::ProfileResponse& profile) {
  double seconds = 0;
  for (const v1::LayerProfile& l : profile.layers()) {
    seconds += l.forward_seconds() + l.backward_seconds();
  }
  return seconds;
}

WorkerSpeeds SpeedsByKind(
    const std::vector<v1::WorkerInfo>& workers,
    const v1::ProfileResponse& reference,
    const std::map<std::string, v1::ProfileResponse>& profiles) {
  WorkerSpeeds out;
  out.speed.assign(workers.size(), 1.0);
  if (workers.empty()) return out;
  const double reference_seconds = ProfiledComputeSeconds(reference);
  const double reference_gflops = workers[0].gemm_gflops();
  const std::vector<std::vector<int>> kinds = GroupWorkerKinds(workers);
  for (size_t k = 0; k < kinds.size(); ++k) {
    const std::vector<int>& members = kinds[k];
    double speed = 1.0;
    std::string source = "reference, profiled on " + workers[0].id();
    if (k > 0) {
      const v1::ProfileResponse* profile = nullptr;
      for (int i : members) {
        auto it = profiles.find(workers[i].id());
        if (it != profiles.end() && ProfiledComputeSeconds(it->second) > 0) {
          profile = &it->second;
          source = "profiled on " + workers[i].id();
          break;
        }
      }
      const double gflops = workers[members.front()].gemm_gflops();
      if (profile != nullptr && reference_seconds > 0) {
        speed = reference_seconds / ProfiledComputeSeconds(*profile);
      } else if (reference_gflops > 0 && gflops > 0) {
        speed = gflops / reference_gflops;
        source = absl::StrFormat("GEMM %.1f vs %.1f GFLOP/s (not profiled)",
                                 gflops, reference_gflops);
      } else {
        source = "no speed measured: equal (not profiled)";
      }
    }
    std::vector<std::string> ids;
    for (int i : members) {
      out.speed[i] = speed;
      ids.push_back(workers[i].id());
    }
    const v1::WorkerInfo& first = workers[members.front()];
    absl::StrAppendFormat(
        &out.explanation, "kind %d: %s x%d (%s): speed %.3g, %s\n", k + 1,
        first.device().empty() ? first.device_kind() : first.device(),
        members.size(), absl::StrJoin(ids, ", "), speed, source);
  }
  return out;
}

}  // namespace pipetrain
