// Distributed differential privacy for secure aggregation: each client adds its share of
// Skellam noise (the difference of two Poisson variables, Agarwal, Kairouz, Liu 2021) to its
// quantized update before masking, so the sum the aggregator unmasks carries the noise the
// accountant (aggregator/dp.h) assumes and no single party ever sees a noise-free update.
// The randomness is AES-128-CTR keyed from OpenSSL's DRBG: a cryptographic stream, not a
// seeded simulation generator.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/secagg/crypto.h"
#include "core/util/status.h"

namespace starling::secagg {

// Uniform doubles from an AES-128-CTR keystream.
class SecureStream {
 public:
  // Keyed from OpenSSL's DRBG.
  static Result<SecureStream> fresh();
  // Keyed from `key` (tests: a reproducible stream).
  static SecureStream keyed(const Key32& key) { return SecureStream(key); }
  // Uniform in [0, 1) with 53 random bits.
  Result<double> uniform();

 private:
  explicit SecureStream(const Key32& key) : key_(key) {}
  Key32 key_;
  std::vector<uint32_t> block_;
  size_t next_ = 0;
  uint64_t blocks_ = 0;
};

// A Poisson(lambda) variate: multiplication for lambda < 10, Hormann's PTRS (transformed
// rejection with squeeze, 1993) above. REQUIRES: lambda >= 0.
Result<int64_t> poisson(double lambda, SecureStream& stream);

// v[i] += Skellam(variance) mod 2^bits for every coordinate: Poisson(variance / 2) minus an
// independent Poisson(variance / 2), variance `variance`, symmetric about 0.
Status add_skellam(std::span<uint32_t> v, double variance, uint32_t bits, SecureStream& stream);

// The integer-domain sensitivities of one client's update clipped to L2 norm `clip_norm`,
// scaled by `scale` and stochastically rounded in `dim` coordinates: L2 <= scale * clip_norm +
// sqrt(dim) (each coordinate moves by less than 1), L1 <= L2 * min(sqrt(dim), L2) (integers).
struct Sensitivity {
  double l1 = 0;
  double l2 = 0;
};
Sensitivity rounded_sensitivity(double clip_norm, double scale, uint64_t dim);

}  // namespace starling::secagg
