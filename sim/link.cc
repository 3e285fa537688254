// Seeded link and device emulation.
#include "sim/link.h"

#include <cmath>

#include "core/util/rng.h"

namespace starling::sim {
namespace {
// Stream tags, so that the draws of one client never overlap.
constexpr uint64_t kProfile = 1, kAvailable = 2, kDrop = 3, kTransfer = 4;
}  // namespace

LinkOptions LinkOptions::from_proto(const v1::FedSimulateConfig& s) {
  LinkOptions o;
  o.down_mbps = s.bandwidth_down_mbps();
  o.up_mbps = s.bandwidth_up_mbps();
  o.bandwidth_spread = s.bandwidth_spread();
  o.latency_ms = s.latency_ms();
  o.latency_spread = s.latency_spread();
  o.loss = s.loss();
  o.step_ms = s.step_ms();
  o.speed_spread = s.speed_spread();
  o.straggler_fraction = s.straggler_fraction();
  o.straggler_slowdown = s.straggler_slowdown();
  o.availability = s.availability();
  o.dropout = s.dropout();
  o.late_join_fraction = s.late_join_fraction();
  o.late_join_rounds = s.late_join_rounds();
  return o;
}

ClientProfile LinkModel::profile(int client) const {
  Rng rng = Rng(seed_).fork(kProfile).fork(static_cast<uint64_t>(client));
  ClientProfile p;
  const double bw = options_.bandwidth_spread * rng.normal();
  p.down_bytes_per_s = options_.down_mbps * 1e6 / 8 * std::exp(bw);
  p.up_bytes_per_s = options_.up_mbps * 1e6 / 8 * std::exp(bw);
  p.latency_s = options_.latency_ms * 1e-3 * std::exp(options_.latency_spread * rng.normal());
  double step = options_.step_ms * 1e-3 * std::exp(options_.speed_spread * rng.normal());
  if (rng.uniform() < options_.straggler_fraction) step *= options_.straggler_slowdown;
  p.seconds_per_step = step;
  if (rng.uniform() < options_.late_join_fraction && options_.late_join_rounds > 0) {
    p.join_round = 2 + static_cast<uint32_t>(rng.below(options_.late_join_rounds));
  }
  return p;
}

bool LinkModel::available(int client, uint64_t round) const {
  if (round < profile(client).join_round) return false;
  if (options_.availability >= 1.0) return true;
  Rng rng = Rng(seed_).fork(kAvailable).fork(static_cast<uint64_t>(client)).fork(round);
  return rng.uniform() < options_.availability;
}

bool LinkModel::drops(int client, uint64_t round, uint64_t attempt) const {
  if (options_.dropout <= 0.0) return false;
  Rng rng =
      Rng(seed_).fork(kDrop).fork(static_cast<uint64_t>(client)).fork((round << 16) + attempt);
  return rng.uniform() < options_.dropout;
}

double LinkModel::transfer_seconds(int client, uint64_t round, int direction, uint64_t bytes,
                                   uint64_t chunks, double bytes_per_s, double latency_s) const {
  double seconds = latency_s + static_cast<double>(bytes) / bytes_per_s;
  if (options_.loss > 0.0 && chunks > 0) {
    Rng rng = Rng(seed_)
                  .fork(kTransfer)
                  .fork(static_cast<uint64_t>(client))
                  .fork(round * 2 + static_cast<uint64_t>(direction));
    const double chunk_seconds =
        static_cast<double>(bytes) / static_cast<double>(chunks) / bytes_per_s;
    for (uint64_t c = 0; c < chunks; ++c) {
      // Each attempt of this chunk is lost with probability `loss` (at most 64 resends).
      for (int tries = 0; tries < 64 && rng.uniform() < options_.loss; ++tries) {
        seconds += 2 * latency_s + chunk_seconds;
      }
    }
  }
  return seconds;
}

}  // namespace starling::sim
