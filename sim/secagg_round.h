// One secure aggregation round of the in-process simulation: the real SecAgg+ client and server
// state machines (core/secagg/protocol.h) with every message framed as an Envelope and counted
// as on the wire; the aggregator side only ever sees the masked vectors and their sum.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/secagg/encode.h"
#include "core/secagg/protocol.h"
#include "core/secagg/quantize.h"
#include "core/util/rng.h"
#include "core/util/status.h"
#include "core/wire/federation.pb.h"

namespace starling::sim {

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

// names[i]: client i of the round (selection order), params.num_clients of them. A round the
// threshold cannot carry is FailedPrecondition (the caller retries it; nothing was unmasked).
Result<SecAggRoundResult> run_secagg_round(const v1::FedSecAggConfig& config, uint64_t round,
                                           const secagg::Params& params,
                                           std::span<const std::string> names,
                                           const SecAggInput& input);

}  // namespace starling::sim
