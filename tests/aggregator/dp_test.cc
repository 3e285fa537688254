// The RDP accountant against published values of TensorFlow Privacy / dp_accounting
// (rdp_privacy_accountant_test.py), the DP noise, and the checkpoint text of the RDP curve.
#include "aggregator/dp.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

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

TEST_CASE("DP noise is seeded and has the asked standard deviation", "[dp]") {
  std::vector<float> a(20000, 0.0f);
  std::vector<float> b(20000, 0.0f);
  Rng ra = Rng(7).fork(3);
  Rng rb = Rng(7).fork(3);
  add_gaussian_noise(a, 0.5, ra);
  add_gaussian_noise(b, 0.5, rb);
  CHECK(a == b);
  double s = 0;
  double s2 = 0;
  for (float x : a) {
    s += x;
    s2 += static_cast<double>(x) * x;
  }
  const double mean = s / a.size();
  const double sd = std::sqrt(s2 / a.size() - mean * mean);
  CHECK(std::abs(mean) < 0.02);
  CHECK(sd == Approx(0.5).epsilon(0.03));
}

}  // namespace
}  // namespace starling::aggregator
