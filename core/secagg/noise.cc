#include "core/secagg/noise.h"

#include <algorithm>
#include <cmath>

namespace starling::secagg {
namespace {

constexpr size_t kBlockWords = 4096;

}  // namespace

Result<SecureStream> SecureStream::fresh() {
  Key32 key{};
  RETURN_IF_ERROR(random_bytes(key));
  return SecureStream(key);
}

Result<double> SecureStream::uniform() {
  if (next_ + 2 > block_.size()) {
    // The next block of the keystream: AES-CTR over zeros, with the block counter as the
    // session so blocks never repeat.
    block_.assign(kBlockWords, 0u);
    const uint64_t b = blocks_++;
    const std::string session(reinterpret_cast<const char*>(&b), sizeof b);
    RETURN_IF_ERROR(apply_mask(key_, session, block_, +1, 32));
    next_ = 0;
  }
  const uint64_t hi = block_[next_++], lo = block_[next_++];
  const uint64_t bits = ((hi << 32) | lo) >> 11;
  return static_cast<double>(bits) * 0x1.0p-53;
}

Result<int64_t> poisson(double lambda, SecureStream& s) {
  if (!(lambda >= 0) || !std::isfinite(lambda)) {
    return invalid_argument("poisson: lambda " + std::to_string(lambda));
  }
  if (lambda == 0) return 0;
  if (lambda < 10) {
    const double limit = std::exp(-lambda);
    int64_t k = 0;
    double p = 1.0;
    for (;;) {
      ASSIGN_OR_RETURN(const double u, s.uniform());
      p *= u;
      if (p <= limit) return k;
      ++k;
    }
  }
  // PTRS (Hormann 1993), as numpy's random_poisson_ptrs.
  const double slam = std::sqrt(lambda), loglam = std::log(lambda);
  const double b = 0.931 + 2.53 * slam;
  const double a = -0.059 + 0.02483 * b;
  const double invalpha = 1.1239 + 1.1328 / (b - 3.4);
  const double vr = 0.9277 - 3.6224 / (b - 2);
  for (;;) {
    ASSIGN_OR_RETURN(const double u0, s.uniform());
    ASSIGN_OR_RETURN(const double v, s.uniform());
    const double u = u0 - 0.5;
    const double us = 0.5 - std::abs(u);
    const double k = std::floor((2 * a / us + b) * u + lambda + 0.43);
    if (us >= 0.07 && v <= vr) return static_cast<int64_t>(k);
    if (k < 0 || (us < 0.013 && v > us)) continue;
    if (std::log(v) + std::log(invalpha) - std::log(a / (us * us) + b) <=
        -lambda + k * loglam - std::lgamma(k + 1)) {
      return static_cast<int64_t>(k);
    }
  }
}

Status add_skellam(std::span<uint32_t> v, double variance, uint32_t bits, SecureStream& stream) {
  if (variance <= 0) return ok_status();
  const uint32_t mask = modulus_mask(bits);
  for (auto& x : v) {
    ASSIGN_OR_RETURN(const int64_t a, poisson(variance / 2, stream));
    ASSIGN_OR_RETURN(const int64_t b, poisson(variance / 2, stream));
    x = (x + static_cast<uint32_t>(static_cast<uint64_t>(a - b))) & mask;
  }
  return ok_status();
}

Sensitivity rounded_sensitivity(double clip_norm, double scale, uint64_t dim) {
  const double root = std::sqrt(static_cast<double>(dim));
  Sensitivity s;
  s.l2 = scale * clip_norm + root;
  s.l1 = s.l2 * std::min(root, s.l2);
  return s;
}

}  // namespace starling::secagg
