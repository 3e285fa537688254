#include "sim/secagg_round.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "core/compress/internal/kernels.h"
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

secagg::Quantizer secagg_quantizer(const v1::FedSecAggConfig& c) {
  return secagg::Quantizer{c.clip_range(), c.quantization_levels(), c.modulus_bits()};
}

SecAggCoordinates secagg_coordinates(double ratio, size_t numel, uint64_t round_seed) {
  SecAggCoordinates c;
  if (ratio <= 0) return c;
  c.sparse = true;
  const auto n = static_cast<int64_t>(numel);
  const int64_t k =
      std::clamp<int64_t>(static_cast<int64_t>(std::ceil(ratio * static_cast<double>(n))), 1, n);
  compress::internal::randk_indices(n, k, round_seed, c.index);
  const compress::internal::Strata strata(n, k);
  c.stratum.resize(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j)
    c.stratum[static_cast<size_t>(j)] = static_cast<float>(strata.size(j));
  return c;
}

void secagg_encode(const secagg::Quantizer& q, const SecAggCoordinates& c,
                   std::span<const float> delta, std::span<float> residual, Rng& rng,
                   std::vector<uint32_t>& out) {
  out.resize(c.length(delta.size()));
  if (!c.sparse) {
    q.quantize(delta, residual, rng, out);
    return;
  }
  const bool ef = !residual.empty();
  std::vector<float> picked(c.index.size());
  for (size_t j = 0; j < c.index.size(); ++j) {
    const uint32_t i = c.index[j];
    picked[j] = ef ? delta[i] + residual[i] : delta[i] * c.stratum[j];
  }
  q.quantize(picked, {}, rng, out);
  if (!ef) return;
  // What was not sent: everything off the chosen coordinates, and on them what the clipping
  // and the rounding left.
  for (size_t i = 0; i < delta.size(); ++i) residual[i] += delta[i];
  std::vector<float> sent(out.size());
  q.dequantize_sum(out, sent);
  for (size_t j = 0; j < c.index.size(); ++j) residual[c.index[j]] -= sent[j];
}

void secagg_scatter(const SecAggCoordinates& c, std::span<const float> sum, std::span<float> out) {
  if (!c.sparse) {
    std::copy(sum.begin(), sum.end(), out.begin());
    return;
  }
  std::fill(out.begin(), out.end(), 0.0f);
  for (size_t j = 0; j < c.index.size(); ++j) out[c.index[j]] = sum[j];
}

Result<secagg::Params> plan_secagg(const v1::FedSecAggConfig& config, uint32_t n, size_t numel) {
  return secagg::plan_round(n, config.threshold(), config.degree(), config.modulus_bits(), numel,
                            config.dropout_tolerance());
}

double secagg_client_variance(const v1::FedSecAggConfig& config, const secagg::Params& params) {
  if (config.noise_multiplier() <= 0) return 0.0;
  const auto sens = secagg::rounded_sensitivity(
      config.dp_clip_norm(), secagg_quantizer(config).scale(), params.vector_length);
  const double total = std::pow(config.noise_multiplier() * sens.l2, 2);
  // Split over the survivors expected at dropout_tolerance (never fewer than the threshold);
  // the accountant then charges each round for the noise its survivors actually added.
  const double n = params.num_clients;
  const double expected = std::floor(n * (1.0 - config.dropout_tolerance()) + 1e-9);
  return total / std::max<double>(params.threshold, expected);
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
  secagg_quantizer(config).dequantize_sum(sum, res.sum);
  res.sum_raw = sum;
  return res;
}

}  // namespace starling::sim
