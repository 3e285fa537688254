// Central differential privacy for the aggregator (DP-FedAvg, McMahan et al. 2018): per-update
// clipping, Gaussian noise on the average, and a Renyi-DP accountant (Mironov 2017; Mironov,
// Talwar, Zhang 2019) for the Poisson-subsampled Gaussian mechanism that reports epsilon.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/util/rng.h"
#include "core/util/status.h"

namespace starling::aggregator {

// DP-FedAvg with a fixed denominator: each round samples every available client
// independently with probability q (Poisson sampling, the accountant's model), each update is
// clipped to L2 norm clip_norm and folded with weight 1, and the round's delta is
// sum / expected_updates + N(0, sigma^2) per coordinate, expected_updates = q * available,
// sigma = noise_multiplier * clip_norm / expected_updates. Disabled when clip_norm == 0.
struct DpOptions {
  double clip_norm = 0.0;
  double noise_multiplier = 0.0;
  double delta = 1e-5;  // epsilon is reported at this delta
  // 0 (every real run): the sampling and the noise come from OpenSSL's DRBG, so nobody, with
  // or without the config, can recompute them. Else a simulation's reproducible stream (round r
  // uses Rng(simulation_seed).fork(r)): the aggregator refuses it outside a simulation.
  uint64_t simulation_seed = 0;
  bool enabled() const { return clip_norm > 0; }
};

// Where DP-FedAvg's randomness comes from: OpenSSL's DRBG (RAND_priv_bytes, reseeded from the
// operating system) unless the simulation asked for a seeded stream. Gaussians by Box-Muller
// on 53-bit uniforms.
class NoiseSource {
 public:
  static NoiseSource secure();
  static NoiseSource seeded(uint64_t seed) { return NoiseSource(seed); }
  bool reproducible() const { return seeded_; }

  // Uniform in [0, 1) with 53 random bits. Internal error when the DRBG fails (it then
  // refuses to produce bytes rather than produce predictable ones).
  Result<double> uniform();
  // v[i] += stddev * (a standard normal), in index order.
  Status add_gaussian(std::span<float> v, double stddev);

 private:
  NoiseSource() : rng_(0) {}
  explicit NoiseSource(uint64_t seed) : seeded_(true), rng_(seed) {}
  Status refill();
  Result<uint64_t> next_u64();

  bool seeded_ = false;
  Rng rng_;
  std::vector<uint64_t> pool_;  // DRBG output not used yet (secure only)
  size_t next_ = 0;
};

// Draws the clients of one DP round: each of `available` clients independently with
// probability q (Poisson sampling). The indices drawn, ascending.
Result<std::vector<size_t>> poisson_sample(size_t available, double q, NoiseSource& source);

// The RDP orders tracked: 1.1, 1.2, ..., 10.9, 12, 13, ..., 63, 128, 256, 512 (those of
// TensorFlow Privacy / dp_accounting).
std::vector<double> default_rdp_orders();

// RDP at `order` (> 1) of one step of the Gaussian mechanism with noise multiplier `sigma`
// applied to a Poisson subsample with rate q in [0, 1]: 0 for q == 0, infinity for sigma == 0,
// order / (2 sigma^2) for q == 1, otherwise log(A_order) / (order - 1) with A computed exactly
// for integer orders (binomial expansion) and bounded from above for fractional ones (the
// series of Mironov et al. 2019 with absolute terms, as Google's dp_accounting does), in log
// space.
double rdp_subsampled_gaussian(double q, double sigma, double order);

// The smallest epsilon over the orders at which (epsilon, delta)-DP follows from the RDP
// curve, by the conversion of Balle et al. 2020 (Proposition 12 of arXiv:2004.00010):
// eps = rdp + log1p(-1/a) - log(delta * a) / (a - 1), with eps = 0 where delta^2 + expm1(-rdp)
// > 0. `order` is the order that attains it. REQUIRES: orders.size() == rdp.size().
struct PrivacySpent {
  double epsilon = 0.0;
  double order = 0.0;
};
PrivacySpent epsilon_from_rdp(std::span<const double> orders, std::span<const double> rdp,
                              double delta);

// Composition over rounds: the RDP of every step adds up, order by order. Not thread-safe.
class RdpAccountant {
 public:
  explicit RdpAccountant(std::vector<double> orders = default_rdp_orders());
  // `steps` rounds, each sampling clients with rate q and adding noise multiplier sigma.
  void compose(double q, double sigma, uint64_t steps = 1);
  PrivacySpent spent(double delta) const { return epsilon_from_rdp(orders_, rdp_, delta); }
  std::span<const double> orders() const { return orders_; }
  std::span<const double> rdp() const { return rdp_; }
  // Replaces the accumulated RDP (resuming from a checkpoint). InvalidArgument unless it has
  // one finite-or-infinite non-negative value per order.
  Status restore(std::vector<double> rdp);

 protected:
  std::vector<double> orders_;
  std::vector<double> rdp_;
};

// Distributed DP with secure aggregation (core/secagg/noise.h): the sum carries Skellam noise
// of total variance `variance` (integer domain) and one client moves it by at most l2 in L2 and
// l1 in L1. RDP at `order` (> 1) of the Skellam mechanism (Agarwal, Kairouz, Liu 2021, as
// Google's distributed_dp accounting states it in the integer domain):
// order l2^2 / (2 variance) + min(((2 order - 1) l2^2 + 6 l1) / (4 variance^2),
// 3 l1 / (2 variance)).
double rdp_skellam(double order, double l1, double l2, double variance);

// RDP at integer `order` >= 2 of a mechanism with RDP eps(j) at integer orders, applied to a
// Poisson subsample with rate q (the general upper bound of Zhu and Wang 2019), never above the
// unamplified eps(order).
double rdp_poisson_subsampled(int order, double q, const std::function<double(int)>& eps);

// The integer orders tracked for the Skellam mechanism: 2, 3, ..., 128, 256.
std::vector<double> integer_rdp_orders();

// Composition of Poisson-subsampled Skellam rounds, at integer_rdp_orders(); rdp(), restore()
// and spent() as RdpAccountant's. Not thread-safe.
class SkellamAccountant : public RdpAccountant {
 public:
  SkellamAccountant();
  void compose(double q, double l1, double l2, double variance);
};

// The accumulated RDP as text ("%a" hex floats, comma-separated, "inf" allowed) for the
// checkpoint's metadata, and back. DataLoss for text that is not such a list.
std::string rdp_to_text(std::span<const double> rdp);
Result<std::vector<double>> rdp_from_text(const std::string& text);

}  // namespace starling::aggregator
