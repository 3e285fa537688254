// How a client turns its model update into the integers it masks, and how the aggregator turns
// the unmasked sum back into a model delta: clipping and the unbiased quantizer of [secagg]
// (quantize.h), on every coordinate or on a random-k subset shared by the whole round, and the
// client's share of the distributed DP noise. The aggregator sends a round's choices to every
// client as a v1::SecAggEncoding, so client and server never disagree on them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/secagg/protocol.h"
#include "core/secagg/quantize.h"
#include "core/util/rng.h"
#include "core/wire/federation.pb.h"
#include "core/wire/secagg.pb.h"

namespace starling::secagg {

// The quantizer a [secagg] section describes.
Quantizer quantizer_of(const v1::FedSecAggConfig& c);
// The quantizer of a round's encoding (bits: the round's modulus).
Quantizer quantizer_of(const v1::SecAggEncoding& e, uint32_t modulus_bits);

// The coordinates a round's masked vectors carry: every one (local.codec "identity"), or with
// local.codec "randk:ratio=R" a stratified random k = ceil(R numel) of them drawn from a seed
// the whole round shares, so every client's vector lines up with every other's.
struct Coordinates {
  bool sparse = false;
  std::vector<uint32_t> index;  // sparse: one per stratum, increasing
  std::vector<float> stratum;   // sparse: the size of each one's stratum
  size_t length(size_t numel) const { return sparse ? index.size() : numel; }
};
// `ratio` 0: dense.
Coordinates choose_coordinates(double ratio, size_t numel, uint64_t round_seed);

// A client's vector: dense, quantize(delta) with the quantizer's error feedback; sparse, the
// chosen coordinates of delta + residual, then with error feedback (residual not empty) the
// residual keeps all that was not sent, and without it each value is scaled by its stratum's
// size (unbiased: the expectation over the round's draw is delta). out: length(numel) integers.
void encode(const Quantizer& q, const Coordinates& c, std::span<const float> delta,
            std::span<float> residual, Rng& rng, std::vector<uint32_t>& out);
// The unmasked, dequantized sum (length(numel) floats) back on every coordinate.
void scatter(const Coordinates& c, std::span<const float> sum, std::span<float> out);

// Scales `delta` down to L2 norm `clip` when it is longer (distributed DP's sensitivity).
void clip_l2(std::span<float> delta, double clip);

// Each client's share of the distributed DP noise ([secagg] noise_multiplier): the variance of
// its Skellam noise for a round planned as `params`, so that the survivors expected at
// secagg.dropout_tolerance (at least the threshold) carry the total
// (noise_multiplier * L2 sensitivity)^2; fewer survivors carry less, and the accountant charges
// what they carried. 0 without noise.
double client_noise_variance(const v1::FedSecAggConfig& config, const Params& params);

// A round's encoding under [secagg] `c`.
v1::SecAggEncoding encoding_of(const v1::FedSecAggConfig& c, double randk_ratio,
                               uint64_t coordinates_seed, double noise_variance);

// The client's whole encoding of one round, as the aggregator's SecAggEncoding asks: clip (DP),
// quantize on the round's coordinates (error feedback into `residual` when it asks for it; the
// residual is then resized to delta's size), add the Skellam noise share. `delta` is clipped in
// place. Errors name the encoding's field.
Status encode_update(const v1::SecAggEncoding& e, const Params& params, std::span<float> delta,
                     std::vector<float>& residual, Rng& rng, std::vector<uint32_t>& out);

}  // namespace starling::secagg
