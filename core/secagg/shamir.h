// Shamir secret sharing of 32-byte secrets over the prime field GF(2^61 - 1), and the sparse
// communication graph of SecAgg+ (a Harary graph on a random relabelling of the clients).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/secagg/crypto.h"
#include "core/util/status.h"

namespace starling::secagg {

// A 32-byte secret is cut into 5 pieces below 2^56 (4 of 7 bytes, one of 4); each piece is the
// constant term of its own random polynomial of degree threshold - 1. A share is the 5
// polynomials' values at the holder's x (little-endian uint64s): 40 bytes.
inline constexpr size_t kShareBytes = 40;

// One share per x in `xs` (distinct, nonzero, below 2^61 - 1); the polynomial coefficients come
// from OpenSSL's DRBG. REQUIRES: 1 <= threshold <= xs.size().
Result<std::vector<std::string>> shamir_split(const Key32& secret, uint32_t threshold,
                                              std::span<const uint32_t> xs);

// The secret from exactly `threshold` (x, share) pairs (Lagrange interpolation at 0): the first
// `threshold` of `shares` are used. A share of the wrong size, a repeated x or too few shares
// are InvalidArgument; shares that interpolate to no valid secret (a piece >= 2^56) DataLoss.
// Wrong but well-formed shares give a wrong secret: callers check it against a commitment.
Result<Key32> shamir_combine(std::span<const std::pair<uint32_t, std::string>> shares,
                             uint32_t threshold);

// The undirected graph over n clients where each has `degree` neighbours (Harary graph H(k, n):
// positions on a ring, each joined to the degree / 2 nearest on either side), the positions a
// permutation of the clients drawn from `seed`. degree >= n - 1 is the complete graph.
// REQUIRES: degree even or >= n - 1.
class CommunicationGraph {
 public:
  CommunicationGraph(uint32_t n, uint32_t degree, const Key32& seed);
  uint32_t size() const { return n_; }
  bool adjacent(uint32_t a, uint32_t b) const;
  // Ascending.
  const std::vector<uint32_t>& neighbours(uint32_t a) const { return neighbours_[a]; }

 private:
  uint32_t n_ = 0;
  uint32_t half_ = 0;  // ring distance joined
  bool complete_ = false;
  std::vector<uint32_t> position_;
  std::vector<std::vector<uint32_t>> neighbours_;
};

}  // namespace starling::secagg
