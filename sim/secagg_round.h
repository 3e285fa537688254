// One secure aggregation round of the in-process simulation: the real SecAgg+ client and server
// state machines (core/secagg/protocol.h) with every message framed as an Envelope and counted
// as on the wire; the aggregator side only ever sees the masked vectors and their sum.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/secagg/protocol.h"
#include "core/secagg/quantize.h"
#include "core/util/rng.h"
#include "core/util/status.h"
#include "core/wire/federation.pb.h"

namespace starling::sim {

// The quantizer a [secagg] section describes.
secagg::Quantizer secagg_quantizer(const v1::FedSecAggConfig& c);

// The coordinates a round's masked vectors carry: every one (local.codec "identity"), or with
// local.codec "randk:ratio=R" a stratified random k = ceil(R numel) of them drawn from a seed
// the whole round shares, so every client's vector lines up with every other's.
struct SecAggCoordinates {
  bool sparse = false;
  std::vector<uint32_t> index;  // sparse: one per stratum, increasing
  std::vector<float> stratum;   // sparse: the size of each one's stratum
  size_t length(size_t numel) const { return sparse ? index.size() : numel; }
};
// `ratio` 0: dense.
SecAggCoordinates secagg_coordinates(double ratio, size_t numel, uint64_t round_seed);

// A client's vector: dense, quantize(delta) with the quantizer's error feedback; sparse, the
// chosen coordinates of delta + residual, then with error feedback (residual not empty) the
// residual keeps all that was not sent, and without it each value is scaled by its stratum's
// size (unbiased: the expectation over the round's draw is delta). out: length(numel) integers.
void secagg_encode(const secagg::Quantizer& q, const SecAggCoordinates& c,
                   std::span<const float> delta, std::span<float> residual, Rng& rng,
                   std::vector<uint32_t>& out);
// The unmasked, dequantized sum (length(numel) floats) back on every coordinate.
void secagg_scatter(const SecAggCoordinates& c, std::span<const float> sum, std::span<float> out);

struct SecAggRoundResult {
  std::vector<float> sum;         // the survivors' quantized updates, summed and dequantized
  std::vector<uint32_t> sum_raw;  // the same sum, mod 2^modulus_bits
  int survivors = 0;              // clients whose masked vector is in the sum
  int dropped = 0;                // shared their keys, sent no masked vector (their masks removed)
  uint32_t degree = 0;
  uint32_t threshold = 0;
  uint64_t bytes_up = 0;           // framed bytes all clients sent, every stage
  uint64_t bytes_down = 0;         // framed bytes the aggregator sent, every stage
  double server_seconds = 0;       // real time in the aggregator's state machine
  double client_seconds = 0;       // real time in the clients' state machines, summed
  std::vector<double> seconds_of;  // real time in client i's state machine
  std::vector<uint64_t> bytes_of;  // framed bytes client i sent and received
};

// Client i's quantized update (numel integers), asked for when it masks; null for a client that
// shared its keys and then dropped (no masked vector). The vector must stay valid until the
// next call.
using SecAggInput = std::function<const std::vector<uint32_t>*(uint32_t i)>;

// The parameters of a round of n clients masking numel integers, as [secagg] asks (errors
// name the key).
Result<secagg::Params> plan_secagg(const v1::FedSecAggConfig& config, uint32_t n, size_t numel);

// Each client's share of the distributed DP noise ([secagg] noise_multiplier): the variance of
// its Skellam noise for a round planned as `params`, so that the survivors expected at
// secagg.dropout_tolerance (at least the threshold) carry the total
// (noise_multiplier * L2 sensitivity)^2; fewer survivors carry less, and the accountant charges
// what they carried. 0 without noise.
double secagg_client_variance(const v1::FedSecAggConfig& config, const secagg::Params& params);

// names[i]: client i of the round (selection order), params.num_clients of them. A round the
// threshold cannot carry is FailedPrecondition (the caller retries it; nothing was unmasked).
Result<SecAggRoundResult> run_secagg_round(const v1::FedSecAggConfig& config, uint64_t round,
                                           const secagg::Params& params,
                                           std::span<const std::string> names,
                                           const SecAggInput& input);

}  // namespace starling::sim
