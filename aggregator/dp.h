// Central differential privacy for the aggregator (DP-FedAvg, McMahan et al. 2018): per-update
// clipping, Gaussian noise on the average, and a Renyi-DP accountant (Mironov 2017; Mironov,
// Talwar, Zhang 2019) for the Poisson-subsampled Gaussian mechanism that reports epsilon.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/util/rng.h"
#include "core/util/status.h"

namespace starling::aggregator {

// DP-FedAvg with a fixed denominator: each update is clipped to L2 norm clip_norm and folded
// with weight 1; the round's delta is sum / expected_updates + N(0, sigma^2) per coordinate,
// sigma = noise_multiplier * clip_norm / expected_updates. Disabled when clip_norm == 0.
struct DpOptions {
  double clip_norm = 0.0;
  double noise_multiplier = 0.0;
  double delta = 1e-5;  // epsilon is reported at this delta
  uint64_t seed = 1;    // noise stream; round r uses Rng(seed).fork(r)
  bool enabled() const { return clip_norm > 0; }
};

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

 private:
  std::vector<double> orders_;
  std::vector<double> rdp_;
};

// v[i] += stddev * (a standard normal from rng), in index order.
void add_gaussian_noise(std::span<float> v, double stddev, Rng& rng);

// The accumulated RDP as text ("%a" hex floats, comma-separated, "inf" allowed) for the
// checkpoint's metadata, and back. DataLoss for text that is not such a list.
std::string rdp_to_text(std::span<const double> rdp);
Result<std::vector<double>> rdp_from_text(const std::string& text);

}  // namespace starling::aggregator
