// The RDP accountant against published values of TensorFlow Privacy / dp_accounting
// (rdp_privacy_accountant_test.py), the DP noise, and the checkpoint text of the RDP curve.
#include "aggregator/dp.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

namespace starling::aggregator {
namespace {

TEST_CASE("subsampled Gaussian RDP matches dp_accounting's published values", "[dp]") {
  // dp_accounting test_compute_rdp_poisson_sampled_gaussian: q = 0.01, sigma = 2.5, 50 steps.
  const std::vector<double> orders = {1.5, 2.5, 5, 50, 100};
  const std::vector<double> expected = {6.70579741e-04, 1.08548710e-03, 2.18075656e-03,
                                        2.38460375e-02, 1.67416308e02};
  RdpAccountant acc(orders);
  acc.compose(0.01, 2.5, 50);
  for (size_t k = 0; k < orders.size(); ++k) {
    INFO("order " << orders[k]);
    CHECK(acc.rdp()[k] == Approx(expected[k]).epsilon(1e-4));
  }
  CHECK(std::isinf(rdp_subsampled_gaussian(0.01, 2.5, std::numeric_limits<double>::infinity())));
  CHECK(rdp_subsampled_gaussian(0.0, 1.0, 2.0) == 0.0);
  CHECK(std::isinf(rdp_subsampled_gaussian(0.1, 0.0, 2.0)));
}

TEST_CASE("fractional and integer orders agree where they meet", "[dp]") {
  // The series for fractional orders, evaluated next to an integer order, lands next to the
  // binomial sum's value (RDP is continuous and increasing in the order).
  for (double q : {0.001, 0.05, 0.3}) {
    for (double sigma : {0.8, 1.1, 4.0}) {
      const double at3 = rdp_subsampled_gaussian(q, sigma, 3.0);
      const double below = rdp_subsampled_gaussian(q, sigma, 3.0 - 1e-6);
      const double above = rdp_subsampled_gaussian(q, sigma, 3.0 + 1e-6);
      INFO("q " << q << " sigma " << sigma);
      CHECK(below <= at3 * (1 + 1e-4));
      CHECK(above >= at3 * (1 - 1e-4));
      CHECK(below == Approx(at3).epsilon(1e-4));
    }
  }
}

TEST_CASE("epsilon conversion matches dp_accounting's published values", "[dp]") {
  SECTION("pure DP: constant RDP 1.1 over orders 2..32 at delta 1e-5") {
    std::vector<double> orders;
    for (int a = 2; a <= 32; ++a) orders.push_back(a);
    const std::vector<double> rdp(orders.size(), 1.1);
    const auto spent = epsilon_from_rdp(orders, rdp, 1e-5);
    CHECK(spent.epsilon == Approx(1.32783806176).epsilon(1e-9));
    CHECK(spent.order == 32);
  }
  SECTION("the Gaussian mechanism with sigma 4.530877117 is (1, 1e-6)-DP") {
    std::vector<double> orders;
    for (int i = 1000; i < 100000; ++i) orders.push_back(0.001 * i);
    RdpAccountant acc(orders);
    acc.compose(1.0, 4.530877117);
    CHECK(acc.spent(1e-6).epsilon == Approx(1.0).epsilon(1e-6));
  }
}

TEST_CASE("privacy spent grows with rounds and shrinks with noise", "[dp]") {
  RdpAccountant a;
  a.compose(0.1, 1.0, 10);
  RdpAccountant b;
  b.compose(0.1, 1.0, 100);
  RdpAccountant c;
  c.compose(0.1, 2.0, 100);
  const double ea = a.spent(1e-5).epsilon;
  const double eb = b.spent(1e-5).epsilon;
  const double ec = c.spent(1e-5).epsilon;
  CHECK(ea > 0);
  CHECK(eb > ea);
  CHECK(ec < eb);
  RdpAccountant d;
  for (int i = 0; i < 100; ++i) d.compose(0.1, 1.0);
  CHECK(d.spent(1e-5).epsilon == Approx(eb).epsilon(1e-12));
}

TEST_CASE("the RDP curve survives its checkpoint text", "[dp]") {
  RdpAccountant acc;
  acc.compose(0.03, 1.3, 7);
  auto text = rdp_to_text(acc.rdp());
  auto back = rdp_from_text(text);
  REQUIRE(back.ok());
  RdpAccountant restored;
  REQUIRE(restored.restore(*back).ok());
  CHECK(std::equal(acc.rdp().begin(), acc.rdp().end(), restored.rdp().begin()));
  CHECK(rdp_from_text("0x1p-3,inf")->size() == 2);
  CHECK_FALSE(rdp_from_text("0x1p-3,banana").ok());
  CHECK_FALSE(rdp_from_text("-1").ok());
  CHECK_FALSE(restored.restore({1.0, 2.0}).ok());
}

TEST_CASE("epsilon of the sampling used matches dp_accounting 0.6.0 within 1%", "[dp]") {
  // dp_accounting 0.6.0 (pip), RdpAccountant().compose(PoissonSampledDpEvent(q,
  // GaussianDpEvent(sigma)), rounds).get_epsilon(delta): the Poisson sampling the aggregator
  // runs under [dp], with its q composed round by round.
  struct Case {
    std::vector<std::pair<double, uint64_t>> rounds;  // (q, rounds at that q)
    double sigma, delta, epsilon;
  };
  const std::vector<Case> cases = {
      {{{0.2, 50}}, 1.0, 1e-5, 11.34018520297392},  // configs/fed_mnist_dp.toml
      {{{0.01, 1000}}, 1.1, 1e-5, 1.7117701662429012},
      {{{0.2, 25}, {0.25, 25}}, 1.0, 1e-5, 12.77146922448897},  // availability changed
  };
  for (const auto& c : cases) {
    RdpAccountant acc;
    for (const auto& [q, n] : c.rounds) acc.compose(q, c.sigma, n);
    INFO("sigma " << c.sigma << ", first q " << c.rounds[0].first);
    CHECK(acc.spent(c.delta).epsilon == Approx(c.epsilon).epsilon(0.01));
  }
}

double mean_of(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += x;
  return s / static_cast<double>(v.size());
}

double sd_of(const std::vector<float>& v) {
  const double m = mean_of(v);
  double s2 = 0;
  for (float x : v) s2 += (x - m) * (x - m);
  return std::sqrt(s2 / static_cast<double>(v.size()));
}

TEST_CASE("DP noise from the DRBG: the asked standard deviation, never the same twice", "[dp]") {
  std::vector<float> a(20001, 0.0f);  // odd: the last Box-Muller pair is half used
  std::vector<float> b(20001, 0.0f);
  auto sa = NoiseSource::secure();
  auto sb = NoiseSource::secure();
  CHECK_FALSE(sa.reproducible());
  REQUIRE(sa.add_gaussian(a, 0.5).ok());
  REQUIRE(sb.add_gaussian(b, 0.5).ok());
  CHECK(a != b);
  CHECK(std::abs(mean_of(a)) < 0.02);
  CHECK(sd_of(a) == Approx(0.5).epsilon(0.03));
  CHECK(a.back() != 0.0f);
  // Two draws of one source differ too, and neither is the seeded stream of any small seed.
  std::vector<float> c(64, 0.0f);
  std::vector<float> d(64, 0.0f);
  REQUIRE(sa.add_gaussian(c, 1.0).ok());
  REQUIRE(sa.add_gaussian(d, 1.0).ok());
  CHECK(c != d);
  for (uint64_t seed = 0; seed < 64; ++seed) {
    std::vector<float> e(64, 0.0f);
    REQUIRE(NoiseSource::seeded(seed).add_gaussian(e, 1.0).ok());
    CHECK(e != c);
  }
}

TEST_CASE("seeded DP noise (simulations only) repeats and has the asked deviation", "[dp]") {
  std::vector<float> a(20000, 0.0f);
  std::vector<float> b(20000, 0.0f);
  auto sa = NoiseSource::seeded(7);
  auto sb = NoiseSource::seeded(7);
  CHECK(sa.reproducible());
  REQUIRE(sa.add_gaussian(a, 0.5).ok());
  REQUIRE(sb.add_gaussian(b, 0.5).ok());
  CHECK(a == b);
  CHECK(std::abs(mean_of(a)) < 0.02);
  CHECK(sd_of(a) == Approx(0.5).epsilon(0.03));
}

TEST_CASE("Poisson sampling draws each client with probability q", "[dp]") {
  auto src = NoiseSource::secure();
  std::vector<int> hits(50, 0);
  int total = 0;
  constexpr int kRounds = 4000;
  for (int r = 0; r < kRounds; ++r) {
    auto drawn = poisson_sample(50, 0.2, src);
    REQUIRE(drawn.ok());
    REQUIRE(std::is_sorted(drawn->begin(), drawn->end()));
    for (size_t i : *drawn) ++hits[i];
    total += static_cast<int>(drawn->size());
  }
  // Mean count 10 (sd of the mean over 4000 rounds ~0.045); each client near 800 of 4000.
  CHECK(static_cast<double>(total) / kRounds == Approx(10.0).margin(0.25));
  for (int h : hits) CHECK(std::abs(h - 800) < 150);
  auto none = poisson_sample(50, 0.0, src);
  REQUIRE(none.ok());
  CHECK(none->empty());
  auto all = poisson_sample(50, 1.0, src);
  REQUIRE(all.ok());
  CHECK(all->size() == 50);
}

}  // namespace
}  // namespace starling::aggregator
