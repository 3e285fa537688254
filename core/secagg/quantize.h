// What a client masks: its update clipped and quantized to integers mod 2^bits with unbiased
// stochastic rounding (error feedback optional), and how the aggregator turns the unmasked sum
// back into floats; plus the packing of integers at `bits` bits each for the wire.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/util/rng.h"
#include "core/util/status.h"

namespace starling::secagg {

// Coordinates are clipped to [-clip_range, clip_range] and scaled by
// scale = (levels - 1) / (2 clip_range), then rounded stochastically to an integer in
// [-(levels - 1) / 2, (levels - 1) / 2] and stored mod 2^bits (two's complement).
struct Quantizer {
  double clip_range = 1.0;
  uint32_t levels = 1u << 16;
  uint32_t bits = 32;

  double scale() const { return static_cast<double>(levels - 1) / (2.0 * clip_range); }
  // The largest |integer| one client contributes (before noise).
  uint64_t max_magnitude() const { return (levels - 1) / 2; }
  // Checks the fields and that `clients` contributions, each within max_magnitude() plus
  // `noise_margin`, cannot wrap around mod 2^bits: InvalidArgument naming the [secagg] key.
  Status validate(uint32_t clients, double noise_margin = 0.0) const;

  // out[i] = stochastic_round(clip(x[i] + residual[i]) * scale) mod 2^bits; residual (empty:
  // none) becomes what was not sent, x + residual - out / scale (clipping included).
  // E[out / scale] = clip(x + residual): the rounding is unbiased.
  // REQUIRES: out.size() == x.size(); residual empty or of x's size.
  void quantize(std::span<const float> x, std::span<float> residual, Rng& rng,
                std::span<uint32_t> out) const;
  // sum (mod 2^bits) lifted to (-2^(bits-1), 2^(bits-1)], divided by scale: the sum of the
  // clients' quantized vectors as floats.
  void dequantize_sum(std::span<const uint32_t> sum, std::span<float> out) const;
};

// Integers below 2^bits, little-endian, `bits` bits each, no padding except at the end.
std::string pack_bits(std::span<const uint32_t> v, uint32_t bits);
// DataLoss when `packed` is not exactly the size of n integers of `bits` bits.
Status unpack_bits(std::string_view packed, uint32_t bits, std::span<uint32_t> out);
inline size_t packed_size(size_t n, uint32_t bits) { return (n * bits + 7) / 8; }

}  // namespace starling::secagg
