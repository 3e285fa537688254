#include "core/secagg/encode.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/compress/internal/kernels.h"
#include "core/secagg/noise.h"

namespace starling::secagg {

Quantizer quantizer_of(const v1::FedSecAggConfig& c) {
  return Quantizer{c.clip_range(), c.quantization_levels(), c.modulus_bits()};
}

Quantizer quantizer_of(const v1::SecAggEncoding& e, uint32_t modulus_bits) {
  return Quantizer{e.clip_range(), e.quantization_levels(), modulus_bits};
}

Coordinates choose_coordinates(double ratio, size_t numel, uint64_t round_seed) {
  Coordinates c;
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

void encode(const Quantizer& q, const Coordinates& c, std::span<const float> delta,
            std::span<float> residual, Rng& rng, std::vector<uint32_t>& out) {
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

void scatter(const Coordinates& c, std::span<const float> sum, std::span<float> out) {
  if (!c.sparse) {
    std::copy(sum.begin(), sum.end(), out.begin());
    return;
  }
  std::fill(out.begin(), out.end(), 0.0f);
  for (size_t j = 0; j < c.index.size(); ++j) out[c.index[j]] = sum[j];
}

void clip_l2(std::span<float> delta, double clip) {
  double norm2 = 0;
  for (float v : delta) norm2 += static_cast<double>(v) * v;
  if (norm2 <= clip * clip) return;
  const auto f = static_cast<float>(clip / std::sqrt(norm2));
  for (float& v : delta) v *= f;
}

double client_noise_variance(const v1::FedSecAggConfig& config, const Params& params) {
  if (config.noise_multiplier() <= 0) return 0.0;
  const auto sens = rounded_sensitivity(config.dp_clip_norm(), quantizer_of(config).scale(),
                                        params.vector_length);
  const double total = std::pow(config.noise_multiplier() * sens.l2, 2);
  // Split over the survivors expected at dropout_tolerance (never fewer than the threshold);
  // the accountant then charges each round for the noise its survivors actually added.
  const double n = params.num_clients;
  const double expected = std::floor(n * (1.0 - config.dropout_tolerance()) + 1e-9);
  return total / std::max<double>(params.threshold, expected);
}

v1::SecAggEncoding encoding_of(const v1::FedSecAggConfig& c, double randk_ratio,
                               uint64_t coordinates_seed, double noise_variance) {
  v1::SecAggEncoding e;
  e.set_clip_range(c.clip_range());
  e.set_quantization_levels(c.quantization_levels());
  e.set_error_feedback(c.error_feedback());
  e.set_randk_ratio(randk_ratio);
  e.set_coordinates_seed(coordinates_seed);
  if (noise_variance > 0) {
    e.set_dp_clip_norm(c.dp_clip_norm());
    e.set_noise_variance(noise_variance);
  }
  return e;
}

Status encode_update(const v1::SecAggEncoding& enc, const Params& params, std::span<float> delta,
                     std::vector<float>& residual, Rng& rng, std::vector<uint32_t>& out) {
  const Quantizer q = quantizer_of(enc, params.modulus_bits);
  if (!(enc.clip_range() > 0) || !std::isfinite(enc.clip_range()) ||
      enc.quantization_levels() < 2 || !(enc.randk_ratio() >= 0 && enc.randk_ratio() <= 1) ||
      !(enc.dp_clip_norm() >= 0) || !(enc.noise_variance() >= 0) ||
      !std::isfinite(enc.noise_variance())) {
    return invalid_argument(
        "secagg encoding: clip_range " + std::to_string(enc.clip_range()) +
        ", quantization_levels " + std::to_string(enc.quantization_levels()) + ", randk_ratio " +
        std::to_string(enc.randk_ratio()) + ", dp_clip_norm " + std::to_string(enc.dp_clip_norm()) +
        ", noise_variance " + std::to_string(enc.noise_variance()) + ": out of range");
  }
  const Coordinates c = choose_coordinates(enc.randk_ratio(), delta.size(), enc.coordinates_seed());
  if (c.length(delta.size()) != params.vector_length) {
    return invalid_argument("secagg encoding: " + std::to_string(c.length(delta.size())) +
                            " coordinates of a " + std::to_string(delta.size()) +
                            "-parameter update, the round masks " +
                            std::to_string(params.vector_length));
  }
  if (enc.dp_clip_norm() > 0) clip_l2(delta, enc.dp_clip_norm());
  if (enc.error_feedback()) {
    residual.resize(delta.size(), 0.0f);
  } else {
    residual.clear();
  }
  encode(q, c, delta, residual, rng, out);
  if (enc.noise_variance() > 0) {
    ASSIGN_OR_RETURN(auto noise, SecureStream::fresh());
    RETURN_IF_ERROR(add_skellam(out, enc.noise_variance(), params.modulus_bits, noise),
                    "distributed DP noise");
  }
  return ok_status();
}

}  // namespace starling::secagg
