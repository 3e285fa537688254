#include "sim/secagg_round.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "core/secagg/noise.h"
#include "core/secagg/protocol.h"
#include "core/wire/envelope.h"
#include "core/wire/frame.h"

namespace starling::sim {
namespace {

using Clock = std::chrono::steady_clock;

// The framed size of a secagg stage message, as one Envelope on a TLS stream.
template <typename M>
Result<uint64_t> framed_bytes(const M& m, M* (v1::SecAggMessage::*mutable_stage)()) {
  v1::Envelope e;
  *(e.mutable_secagg()->*mutable_stage)() = m;
  ASSIGN_OR_RETURN(std::string frame, wire::encode_framed_envelope(e, wire::kDefaultMaxFrameBytes));
  return frame.size();
}

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

Result<secagg::Params> plan_secagg(const v1::FedSecAggConfig& config, uint32_t n, size_t numel) {
  return secagg::plan_round(n, config.threshold(), config.degree(), config.modulus_bits(), numel,
                            config.dropout_tolerance());
}

Result<SecAggRoundResult> run_secagg_round(const v1::FedSecAggConfig& config, uint64_t round,
                                           const secagg::Params& params,
                                           std::span<const std::string> names,
                                           const SecAggInput& input) {
  using secagg::ClientSession;
  using secagg::ServerSession;
  const auto n = static_cast<uint32_t>(names.size());
  const size_t numel = params.vector_length;
  SecAggRoundResult res;
  if (n != params.num_clients) {
    return invalid_argument("secagg: " + std::to_string(n) + " names for a round of " +
                            std::to_string(params.num_clients));
  }
  res.degree = params.degree;
  res.threshold = params.threshold;
  auto t = Clock::now();
  ASSIGN_OR_RETURN(auto server, ServerSession::create(round, params, {names.begin(), names.end()}));
  res.server_seconds += since(t);
  std::vector<std::unique_ptr<ClientSession>> clients(n);
  res.seconds_of.assign(n, 0.0);
  res.bytes_of.assign(n, 0);
  uint32_t who = 0;  // the client the next up / down message is from / to
  auto up = [&](auto&& m, auto stage) -> Status {
    ASSIGN_OR_RETURN(uint64_t b, framed_bytes(m, stage));
    res.bytes_up += b;
    res.bytes_of[who] += b;
    return ok_status();
  };
  auto down = [&](auto&& m, auto stage) -> Status {
    ASSIGN_OR_RETURN(uint64_t b, framed_bytes(m, stage));
    res.bytes_down += b;
    res.bytes_of[who] += b;
    return ok_status();
  };
  auto client_time = [&](Clock::time_point t0) {
    const double s = since(t0);
    res.client_seconds += s;
    res.seconds_of[who] += s;
  };
  // Stage 0: setup and advertised keys.
  for (uint32_t i = 0; i < n; ++i) {
    who = i;
    const v1::SecAggSetup setup = server->setup(i);
    RETURN_IF_ERROR(down(setup, &v1::SecAggMessage::mutable_setup));
    t = Clock::now();
    ASSIGN_OR_RETURN(clients[i], ClientSession::create(round, setup), names[i]);
    client_time(t);
    RETURN_IF_ERROR(up(clients[i]->advertise(), &v1::SecAggMessage::mutable_advertise));
    t = Clock::now();
    RETURN_IF_ERROR(server->receive_advertise(clients[i]->advertise()));
    res.server_seconds += since(t);
  }
  RETURN_IF_ERROR(server->close_advertise());
  // Stage 1: neighbours' keys out, encrypted shares in.
  for (uint32_t i = 0; i < n; ++i) {
    who = i;
    t = Clock::now();
    const v1::SecAggKeys keys = server->keys_for(i);
    res.server_seconds += since(t);
    RETURN_IF_ERROR(down(keys, &v1::SecAggMessage::mutable_keys));
    t = Clock::now();
    ASSIGN_OR_RETURN(const v1::SecAggShareKeys shares, clients[i]->share_keys(keys), names[i]);
    client_time(t);
    RETURN_IF_ERROR(up(shares, &v1::SecAggMessage::mutable_share_keys));
    t = Clock::now();
    RETURN_IF_ERROR(server->receive_share_keys(shares));
    res.server_seconds += since(t);
  }
  RETURN_IF_ERROR(server->close_share_keys());
  // Stage 2: ciphertexts out, masked vectors in (from those that did not drop).
  for (uint32_t i = 0; i < n; ++i) {
    who = i;
    t = Clock::now();
    const v1::SecAggCiphertexts cts = server->ciphertexts_for(i);
    res.server_seconds += since(t);
    RETURN_IF_ERROR(down(cts, &v1::SecAggMessage::mutable_ciphertexts));
    const std::vector<uint32_t>* x = input(i);
    if (x == nullptr) {
      ++res.dropped;
      continue;
    }
    t = Clock::now();
    ASSIGN_OR_RETURN(const v1::SecAggMaskedInput masked, clients[i]->masked_input(cts, *x),
                     names[i]);
    client_time(t);
    RETURN_IF_ERROR(up(masked, &v1::SecAggMessage::mutable_masked_input));
    t = Clock::now();
    RETURN_IF_ERROR(server->receive_masked_input(masked));
    res.server_seconds += since(t);
  }
  t = Clock::now();
  ASSIGN_OR_RETURN(const v1::SecAggUnmaskRequest request, server->close_masked_input());
  res.server_seconds += since(t);
  // Stage 3: who survived out, shares in.
  for (uint32_t i : server->survivors()) {
    who = i;
    RETURN_IF_ERROR(down(request, &v1::SecAggMessage::mutable_unmask_request));
    t = Clock::now();
    ASSIGN_OR_RETURN(const v1::SecAggUnmaskShares shares, clients[i]->unmask(request), names[i]);
    client_time(t);
    RETURN_IF_ERROR(up(shares, &v1::SecAggMessage::mutable_unmask_shares));
    t = Clock::now();
    RETURN_IF_ERROR(server->receive_unmask_shares(shares));
    res.server_seconds += since(t);
  }
  t = Clock::now();
  ASSIGN_OR_RETURN(const std::vector<uint32_t> sum, server->finish());
  res.server_seconds += since(t);
  res.survivors = static_cast<int>(server->survivors().size());
  res.sum.resize(numel);
  secagg::quantizer_of(config).dequantize_sum(sum, res.sum);
  res.sum_raw = sum;
  return res;
}

}  // namespace starling::sim
