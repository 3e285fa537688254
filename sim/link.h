// Emulated links and devices of virtual clients: bandwidth, latency, chunk loss, compute speed,
// stragglers and availability traces (offline rounds, mid-round dropouts, late joiners). Every
// value is a pure function of (seed, client, round), so nothing is stored per client and a run
// repeats bit for bit.
#pragma once

#include <cstdint>

#include "core/wire/federation.pb.h"

namespace starling::sim {

struct LinkOptions {
  double down_mbps = 50;          // median downlink, megabits per second
  double up_mbps = 10;            // median uplink
  double bandwidth_spread = 0.5;  // sigma of log(bandwidth)
  double latency_ms = 50;         // median one-way latency
  double latency_spread = 0.5;
  double loss = 0.0;    // probability that a chunk is lost and resent after a round trip
  double step_ms = 20;  // one local step on a median device
  double speed_spread = 0.5;
  double straggler_fraction = 0.0;
  double straggler_slowdown = 10;
  double availability = 1.0;  // P(online in a round)
  double dropout = 0.0;       // P(a selected client vanishes mid-round)
  double late_join_fraction = 0.0;
  uint32_t late_join_rounds = 0;

  static LinkOptions from_proto(const v1::FedSimulateConfig& s);
};

// One client's fixed characteristics.
struct ClientProfile {
  double down_bytes_per_s = 0;
  double up_bytes_per_s = 0;
  double latency_s = 0;
  double seconds_per_step = 0;
  uint32_t join_round = 1;  // first round it can be selected in
};

class LinkModel {
 public:
  LinkModel(LinkOptions options, uint64_t seed) : options_(options), seed_(seed) {}
  ClientProfile profile(int client) const;
  // Online in `round` (joined, and the availability draw says so).
  bool available(int client, uint64_t round) const;
  // Selected in `round` (attempt `attempt`), it vanishes before reporting.
  bool drops(int client, uint64_t round, uint64_t attempt) const;
  // Seconds to move `bytes` in `chunks` chunks at `bytes_per_s` with `latency_s` one way: one
  // latency, the bytes, and per lost chunk (each drawn with `loss` from the (client, round,
  // direction) stream) a resend of that chunk after a round trip.
  double transfer_seconds(int client, uint64_t round, int direction, uint64_t bytes,
                          uint64_t chunks, double bytes_per_s, double latency_s) const;
  const LinkOptions& options() const { return options_; }

 private:
  LinkOptions options_;
  uint64_t seed_;
};

}  // namespace starling::sim
