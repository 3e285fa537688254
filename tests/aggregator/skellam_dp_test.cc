// The accountant of distributed DP with secure aggregation: the Skellam mechanism's RDP, its
// Poisson-subsampled bound, and the epsilon they compose to, against the Gaussian mechanism
// they approach (whose accountant tests/aggregator/dp_test.cc checks against dp_accounting).
#include <catch2/catch.hpp>
#include <cmath>

#include "aggregator/dp.h"

namespace starling::aggregator {

TEST_CASE("skellam RDP: the Gaussian's alpha / (2 z^2) for a large variance, more for a small") {
  // Sensitivity 1000 (integer units), noise std z * 1000.
  const double l2 = 1000, l1 = l2 * 400;
  for (double z : {0.8, 1.5, 4.0}) {
    const double var = std::pow(z * l2, 2);
    for (double order : {2.0, 8.0, 32.0}) {
      const double gauss = order / (2 * z * z);
      const double sk = rdp_skellam(order, l1, l2, var);
      CHECK(sk >= gauss);
      CHECK(sk / gauss - 1 < 1e-3);
    }
  }
  // Little noise in integer units: the discreteness costs more than the Gaussian.
  CHECK(rdp_skellam(8, 40, 2, 4) > 1.01 * 8 * 4 / (2 * 4.0));
  CHECK(std::isinf(rdp_skellam(2, 1, 1, 0)));
}

TEST_CASE("poisson-subsampled RDP: below the unamplified, 0 at q = 0, equal at q = 1") {
  auto eps = [](int order) { return order / (2.0 * 1.2 * 1.2); };
  for (int order : {2, 5, 20, 64}) {
    CHECK(rdp_poisson_subsampled(order, 1.0, eps) == Approx(eps(order)));
    CHECK(rdp_poisson_subsampled(order, 0.0, eps) == 0.0);
    const double small = rdp_poisson_subsampled(order, 0.01, eps);
    const double larger = rdp_poisson_subsampled(order, 0.2, eps);
    CHECK(small < larger);
    CHECK(larger <= eps(order));
  }
}

TEST_CASE("skellam accountant: epsilon near (and never below) the subsampled Gaussian's") {
  // q = 0.2, z = 1.2, 50 rounds, delta 1e-5 (configs/fed_mnist_secagg_dp.toml's setting), with a
  // variance large enough that Skellam is Gaussian to within 1e-3.
  const double l2 = 524734, l1 = l2 * 446;
  SkellamAccountant sk;
  RdpAccountant gauss(integer_rdp_orders());
  for (int r = 0; r < 50; ++r) {
    sk.compose(0.2, l1, l2, std::pow(1.2 * l2, 2));
    gauss.compose(0.2, 1.2);
  }
  const double e_sk = sk.spent(1e-5).epsilon, e_gauss = gauss.spent(1e-5).epsilon;
  INFO("skellam " << e_sk << " gaussian " << e_gauss);
  CHECK(e_sk >= 0.999 * e_gauss);  // the general subsampling bound is looser, never tighter
  CHECK(e_sk < 2.0 * e_gauss);
  // More rounds, more epsilon; more noise, less.
  SkellamAccountant more, quieter;
  for (int r = 0; r < 100; ++r) more.compose(0.2, l1, l2, std::pow(1.2 * l2, 2));
  for (int r = 0; r < 50; ++r) quieter.compose(0.2, l1, l2, std::pow(2.4 * l2, 2));
  CHECK(more.spent(1e-5).epsilon > e_sk);
  CHECK(quieter.spent(1e-5).epsilon < e_sk);
}

}  // namespace starling::aggregator
