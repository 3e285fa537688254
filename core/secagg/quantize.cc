#include "core/secagg/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/secagg/crypto.h"

namespace starling::secagg {

Status Quantizer::validate(uint32_t clients, double noise_margin) const {
  if (!(clip_range > 0) || !std::isfinite(clip_range)) {
    return invalid_argument("secagg.clip_range must be > 0 (got " + std::to_string(clip_range) +
                            ")");
  }
  if (levels < 2) {
    return invalid_argument("secagg.quantization_levels must be >= 2 (got " +
                            std::to_string(levels) + ")");
  }
  if (bits < 2 || bits > 32) {
    return invalid_argument("secagg.modulus_bits must be in [2, 32] (got " + std::to_string(bits) +
                            ")");
  }
  // The lifted sum must stay in (-2^(bits-1), 2^(bits-1)].
  const double worst =
      static_cast<double>(clients) * (static_cast<double>(max_magnitude()) + noise_margin);
  const double room = std::ldexp(1.0, static_cast<int>(bits) - 1) - 1;
  if (worst > room) {
    return invalid_argument("secagg: " + std::to_string(clients) + " clients of up to " +
                            std::to_string(static_cast<uint64_t>(max_magnitude() + noise_margin)) +
                            " each can sum past the modulus 2^" + std::to_string(bits) +
                            ": raise secagg.modulus_bits or lower secagg.quantization_levels");
  }
  return ok_status();
}

void Quantizer::quantize(std::span<const float> x, std::span<float> residual, Rng& rng,
                         std::span<uint32_t> out) const {
  const double s = scale();
  const double half = static_cast<double>(max_magnitude());
  const uint32_t mask = modulus_mask(bits);
  const bool ef = !residual.empty();
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = static_cast<double>(x[i]) + (ef ? static_cast<double>(residual[i]) : 0.0);
    const double scaled = std::clamp(v * s, -half, half);
    const double lo = std::floor(scaled);
    const double q = lo + (rng.uniform() < scaled - lo ? 1.0 : 0.0);
    const int64_t qi = static_cast<int64_t>(q);
    out[i] = static_cast<uint32_t>(static_cast<uint64_t>(qi)) & mask;
    if (ef) residual[i] = static_cast<float>(v - q / s);
  }
}

void Quantizer::dequantize_sum(std::span<const uint32_t> sum, std::span<float> out) const {
  const double inv = 1.0 / scale();
  const uint64_t modulus = 1ull << bits;
  const uint64_t half = modulus >> 1;
  for (size_t i = 0; i < sum.size(); ++i) {
    const uint64_t u = sum[i];
    const int64_t lifted = u > half ? static_cast<int64_t>(u) - static_cast<int64_t>(modulus)
                                    : static_cast<int64_t>(u);
    out[i] = static_cast<float>(static_cast<double>(lifted) * inv);
  }
}

std::string pack_bits(std::span<const uint32_t> v, uint32_t bits) {
  std::string out(packed_size(v.size(), bits), '\0');
  if (bits == 32) {
    std::memcpy(out.data(), v.data(), v.size() * 4);
    return out;
  }
  auto* o = reinterpret_cast<uint8_t*>(out.data());
  uint64_t acc = 0;
  uint32_t have = 0;
  size_t at = 0;
  for (uint32_t x : v) {
    acc |= static_cast<uint64_t>(x) << have;
    have += bits;
    while (have >= 8) {
      o[at++] = static_cast<uint8_t>(acc);
      acc >>= 8;
      have -= 8;
    }
  }
  if (have > 0) o[at] = static_cast<uint8_t>(acc);
  return out;
}

Status unpack_bits(std::string_view packed, uint32_t bits, std::span<uint32_t> out) {
  if (packed.size() != packed_size(out.size(), bits)) {
    return data_loss("a packed vector of " + std::to_string(packed.size()) + " bytes; " +
                     std::to_string(out.size()) + " integers of " + std::to_string(bits) +
                     " bits take " + std::to_string(packed_size(out.size(), bits)));
  }
  if (bits == 32) {
    std::memcpy(out.data(), packed.data(), out.size() * 4);
    return ok_status();
  }
  const auto* p = reinterpret_cast<const uint8_t*>(packed.data());
  const uint32_t mask = modulus_mask(bits);
  uint64_t acc = 0;
  uint32_t have = 0;
  size_t at = 0;
  for (auto& x : out) {
    while (have < bits) {
      acc |= static_cast<uint64_t>(p[at++]) << have;
      have += 8;
    }
    x = static_cast<uint32_t>(acc) & mask;
    acc >>= bits;
    have -= bits;
  }
  return ok_status();
}

}  // namespace starling::secagg
