// One direction of an emulated link (the part of netem the network lab
// needs, computed instead of queued in the kernel): a packet is serialized
// at `rate` behind the packets already on the link, waits in a drop-tail
// queue of at most `queue_limit_bytes` not yet serialized, crosses the link
// in `delay` +/- `jitter` (uniform; a packet never overtakes the one before
// it) and is lost with probability `loss` after it took its link time.
//
// Pure arithmetic on times the caller gives (nanoseconds of any monotonic
// clock) and random draws the caller makes, so it is tested without a
// network. Not thread-safe; owned by the emulator's loop.
#ifndef PIPETRAIN_TESTS_NETLAB_LINK_MODEL_H_
#define PIPETRAIN_TESTS_NETLAB_LINK_MODEL_H_

#include <algorithm>
#include <cstdint>
#include <optional>

namespace pipetrain::netlab {

struct LinkParams {
  double rate_bits_per_s = 0;  // 0: unlimited (no serialization, no queue)
  double delay_s = 0;          // one-way propagation delay
  double jitter_s = 0;         // uniform in [-jitter, +jitter]
  double loss = 0;             // probability a packet is lost
  // 0: twice the bandwidth-delay product of a round trip over this link and
  // its mirror (2 * rate * 2 * delay), at least kMinQueueBytes.
  int64_t queue_limit_bytes = 0;
};

// Eight of the lab's largest packets (its devices' MTU is 65000 bytes).
inline constexpr int64_t kMinQueueBytes = 8 * 65536;

struct LinkCounters {
  int64_t packets = 0;  // delivered
  int64_t bytes = 0;    // delivered
  int64_t lost = 0;     // random loss
  int64_t dropped = 0;  // queue full
};

class LinkModel {
 public:
  explicit LinkModel(const LinkParams& params) : params_(params) {
    limit_bytes_ = params.queue_limit_bytes;
    if (limit_bytes_ <= 0) {
      limit_bytes_ = std::max<int64_t>(
          kMinQueueBytes, static_cast<int64_t>(2 * params.rate_bits_per_s / 8 *
                                               2 * params.delay_s));
    }
  }

  // A packet of `bytes` offered at `now_ns`; `loss_draw` uniform in [0, 1),
  // `jitter_draw` uniform in [-1, 1]. Returns when it arrives at the other
  // end, or nothing when it is lost or the queue is full.
  std::optional<int64_t> Admit(int64_t now_ns, int64_t bytes, double loss_draw,
                               double jitter_draw) {
    int64_t departure = now_ns;
    if (params_.rate_bits_per_s > 0) {
      const int64_t start = std::max(now_ns, free_at_ns_);
      const double backlog_bytes =
          (start - now_ns) * 1e-9 * params_.rate_bits_per_s / 8;
      if (backlog_bytes + bytes > limit_bytes_) {
        ++counters_.dropped;
        return std::nullopt;
      }
      departure = start + static_cast<int64_t>(bytes * 8 * 1e9 /
                                               params_.rate_bits_per_s);
      free_at_ns_ = departure;
    }
    if (loss_draw < params_.loss) {
      ++counters_.lost;
      return std::nullopt;
    }
    const double one_way = params_.delay_s + params_.jitter_s * jitter_draw;
    int64_t arrival =
        departure + static_cast<int64_t>(std::max(0.0, one_way) * 1e9);
    arrival = std::max(arrival, last_arrival_ns_);  // no reordering
    last_arrival_ns_ = arrival;
    ++counters_.packets;
    counters_.bytes += bytes;
    return arrival;
  }

  const LinkParams& params() const { return params_; }
  int64_t queue_limit_bytes() const { return limit_bytes_; }
  const LinkCounters& counters() const { return counters_; }

 private:
  LinkParams params_;
  int64_t limit_bytes_ = 0;
  int64_t free_at_ns_ = 0;
  int64_t last_arrival_ns_ = 0;
  LinkCounters counters_;
};

}  // namespace pipetrain::netlab

#endif  // PIPETRAIN_TESTS_NETLAB_LINK_MODEL_H_
