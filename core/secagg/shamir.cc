#include "core/secagg/shamir.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>
#include <set>

#include "core/util/rng.h"

namespace starling::secagg {
namespace {

__extension__ using U128 = unsigned __int128;
constexpr uint64_t kP = (1ull << 61) - 1;
constexpr int kPieces = 5;
constexpr size_t kPieceBytes[kPieces] = {7, 7, 7, 7, 4};

uint64_t reduce(U128 x) {
  // x < 2^122: fold twice.
  uint64_t lo = static_cast<uint64_t>(x & kP);
  uint64_t hi = static_cast<uint64_t>(x >> 61);
  uint64_t r = lo + hi;
  r = (r & kP) + (r >> 61);
  return r >= kP ? r - kP : r;
}
uint64_t add(uint64_t a, uint64_t b) {
  uint64_t r = a + b;
  return r >= kP ? r - kP : r;
}
uint64_t sub(uint64_t a, uint64_t b) { return a >= b ? a - b : a + kP - b; }
uint64_t mul(uint64_t a, uint64_t b) { return reduce(static_cast<U128>(a) * b); }
uint64_t power(uint64_t a, uint64_t e) {
  uint64_t r = 1;
  while (e) {
    if (e & 1) r = mul(r, a);
    a = mul(a, a);
    e >>= 1;
  }
  return r;
}
uint64_t inverse(uint64_t a) { return power(a, kP - 2); }

std::array<uint64_t, kPieces> pieces_of(const Key32& secret) {
  std::array<uint64_t, kPieces> p{};
  size_t at = 0;
  for (int i = 0; i < kPieces; ++i) {
    uint64_t v = 0;
    for (size_t b = 0; b < kPieceBytes[i]; ++b)
      v |= static_cast<uint64_t>(secret[at + b]) << (8 * b);
    p[i] = v;
    at += kPieceBytes[i];
  }
  return p;
}

void put_u64(std::string& out, uint64_t v) {
  for (int b = 0; b < 8; ++b) out.push_back(static_cast<char>((v >> (8 * b)) & 0xFF));
}
uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int b = 0; b < 8; ++b) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[b])) << (8 * b);
  return v;
}

// A uniform field element from the DRBG (rejection of values >= p).
Result<uint64_t> random_element() {
  for (;;) {
    uint64_t v = 0;
    RETURN_IF_ERROR(random_bytes(std::span<uint8_t>(reinterpret_cast<uint8_t*>(&v), sizeof v)));
    v &= kP;  // 61 bits
    if (v < kP) return v;
  }
}

}  // namespace

Result<std::vector<std::string>> shamir_split(const Key32& secret, uint32_t threshold,
                                              std::span<const uint32_t> xs) {
  if (threshold == 0 || threshold > xs.size()) {
    return invalid_argument("shamir: threshold " + std::to_string(threshold) + " for " +
                            std::to_string(xs.size()) + " holders");
  }
  const auto pieces = pieces_of(secret);
  // coeff[i][d]: polynomial i's coefficient of x^d.
  std::array<std::vector<uint64_t>, kPieces> coeff;
  for (int i = 0; i < kPieces; ++i) {
    coeff[i].resize(threshold);
    coeff[i][0] = pieces[i];
    for (uint32_t d = 1; d < threshold; ++d) {
      ASSIGN_OR_RETURN(coeff[i][d], random_element());
    }
  }
  std::vector<std::string> out;
  out.reserve(xs.size());
  for (uint32_t x : xs) {
    if (x == 0) return invalid_argument("shamir: x = 0 would reveal the secret");
    std::string s;
    s.reserve(kShareBytes);
    for (int i = 0; i < kPieces; ++i) {
      uint64_t y = 0;  // Horner
      for (uint32_t d = threshold; d-- > 0;) y = add(mul(y, x), coeff[i][d]);
      put_u64(s, y);
    }
    out.push_back(std::move(s));
  }
  return out;
}

Result<Key32> shamir_combine(std::span<const std::pair<uint32_t, std::string>> shares,
                             uint32_t threshold) {
  if (threshold == 0 || shares.size() < threshold) {
    return invalid_argument("shamir: " + std::to_string(shares.size()) + " shares, " +
                            std::to_string(threshold) + " needed");
  }
  std::set<uint32_t> seen;
  for (uint32_t k = 0; k < threshold; ++k) {
    const auto& [x, s] = shares[k];
    if (s.size() != kShareBytes) {
      return invalid_argument("shamir: a share of " + std::to_string(s.size()) + " bytes (" +
                              std::to_string(kShareBytes) +
                              " expected) from x = " + std::to_string(x));
    }
    if (x == 0 || x >= kP || !seen.insert(x).second) {
      return invalid_argument("shamir: share x = " + std::to_string(x) + " repeated or invalid");
    }
  }
  // Lagrange basis at 0: l_k = prod_{m != k} x_m / (x_m - x_k).
  std::vector<uint64_t> basis(threshold);
  for (uint32_t k = 0; k < threshold; ++k) {
    uint64_t num = 1, den = 1;
    for (uint32_t m = 0; m < threshold; ++m) {
      if (m == k) continue;
      num = mul(num, shares[m].first);
      den = mul(den, sub(shares[m].first, shares[k].first));
    }
    basis[k] = mul(num, inverse(den));
  }
  Key32 secret{};
  size_t at = 0;
  for (int i = 0; i < kPieces; ++i) {
    uint64_t v = 0;
    for (uint32_t k = 0; k < threshold; ++k) {
      v = add(v, mul(basis[k], get_u64(shares[k].second.data() + 8 * i)));
    }
    if (v >> (8 * kPieceBytes[i])) return data_loss("shamir: the shares are inconsistent");
    for (size_t b = 0; b < kPieceBytes[i]; ++b) secret[at + b] = static_cast<uint8_t>(v >> (8 * b));
    at += kPieceBytes[i];
  }
  return secret;
}

CommunicationGraph::CommunicationGraph(uint32_t n, uint32_t degree, const Key32& seed)
    : n_(n), half_(degree / 2), complete_(n == 0 || degree >= n - 1) {
  // The relabelling: a Fisher-Yates shuffle driven by the seed (public: every party draws the
  // same graph).
  uint64_t s = 0;
  for (int b = 0; b < 8; ++b) s |= static_cast<uint64_t>(seed[b]) << (8 * b);
  Rng rng(s);
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  for (uint32_t i = n; i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
  position_.assign(n, 0);
  for (uint32_t p = 0; p < n; ++p) position_[order[p]] = p;
  neighbours_.assign(n, {});
  for (uint32_t a = 0; a < n; ++a) {
    if (complete_) {
      for (uint32_t b = 0; b < n; ++b) {
        if (b != a) neighbours_[a].push_back(b);
      }
    } else {
      for (uint32_t d = 1; d <= half_; ++d) {
        neighbours_[a].push_back(order[(position_[a] + d) % n]);
        neighbours_[a].push_back(order[(position_[a] + n - d) % n]);
      }
      std::sort(neighbours_[a].begin(), neighbours_[a].end());
      neighbours_[a].erase(std::unique(neighbours_[a].begin(), neighbours_[a].end()),
                           neighbours_[a].end());
    }
  }
}

bool CommunicationGraph::adjacent(uint32_t a, uint32_t b) const {
  if (a == b || a >= n_ || b >= n_) return false;
  if (complete_) return true;
  const uint32_t d = (position_[a] + n_ - position_[b]) % n_;
  return std::min(d, n_ - d) <= half_;
}

}  // namespace starling::secagg
