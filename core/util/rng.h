// Rng: a small, explicitly seeded, platform-independent random generator (xoshiro256**).
// Every random choice in starling goes through one, so runs repeat bit for bit.
#pragma once

#include <cmath>
#include <cstdint>

namespace starling {

class Rng {
 public:
  explicit Rng(uint64_t seed) { reseed(seed); }

  void reseed(uint64_t seed) {
    uint64_t x = seed;
    for (auto& s : s_) s = splitmix64(x);
    has_spare_ = false;
  }

  // A statistically independent generator for sub-stream `stream` (e.g. a client id).
  Rng fork(uint64_t stream) const {
    uint64_t x = s_[0] ^ (stream * 0x9E3779B97F4A7C15ull) ^ s_[3];
    return Rng(splitmix64(x));
  }

  uint64_t next_u64() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  // Uniform in [0, 1) with 24 random bits.
  float uniform_f() { return static_cast<float>(next_u64() >> 40) * 0x1.0p-24f; }
  // Uniform integer in [0, n). REQUIRES: n > 0.
  uint64_t below(uint64_t n) {
    // Lemire's multiply-shift; the tiny bias for huge n is irrelevant here.
    __extension__ using U128 = unsigned __int128;
    return static_cast<uint64_t>((static_cast<U128>(next_u64()) * n) >> 64);
  }
  // Standard normal (Box-Muller, deterministic across platforms unlike std::normal_distribution).
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = 0.0;
    do {
      u1 = uniform();
    } while (u1 <= 0.0);
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    constexpr double kTwoPi = 6.283185307179586476925286766559;
    spare_ = r * std::sin(kTwoPi * u2);
    has_spare_ = true;
    return r * std::cos(kTwoPi * u2);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static uint64_t splitmix64(uint64_t& x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  uint64_t s_[4] = {};
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace starling
