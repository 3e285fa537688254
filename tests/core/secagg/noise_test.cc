// Distributed DP noise: Poisson and Skellam variates with the right moments from a
// cryptographic stream, and the noise surviving secure aggregation into the unmasked sum.
#include "core/secagg/noise.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/secagg/protocol.h"
#include "core/secagg/quantize.h"

namespace starling::secagg {
namespace {

Key32 key_of(uint8_t fill) {
  Key32 k{};
  k.fill(fill);
  return k;
}

}  // namespace

TEST_CASE("poisson: mean and variance lambda, below and above the PTRS switch") {
  for (double lambda : {0.5, 3.0, 9.9, 10.0, 30.0, 1e4, 1e9}) {
    INFO("lambda " << lambda);
    auto s = SecureStream::keyed(key_of(static_cast<uint8_t>(lambda)));
    const int n = 20000;
    double sum = 0, sum2 = 0;
    for (int i = 0; i < n; ++i) {
      auto k = poisson(lambda, s);
      REQUIRE(k.ok());
      REQUIRE(*k >= 0);
      sum += static_cast<double>(*k);
      sum2 += static_cast<double>(*k) * static_cast<double>(*k);
    }
    const double mean = sum / n;
    const double var = sum2 / n - mean * mean;
    CHECK(std::abs(mean - lambda) < 5 * std::sqrt(lambda / n));
    CHECK(std::abs(var / lambda - 1) < 0.08);
  }
  auto s = SecureStream::keyed(key_of(1));
  CHECK(*poisson(0, s) == 0);
  CHECK_FALSE(poisson(-1, s).ok());
  CHECK_FALSE(poisson(std::nan(""), s).ok());
}

TEST_CASE("secure stream: a fresh stream is unpredictable, a keyed one repeats") {
  auto a = SecureStream::fresh(), b = SecureStream::fresh();
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(*a->uniform() != *b->uniform());
  auto c = SecureStream::keyed(key_of(7)), d = SecureStream::keyed(key_of(7));
  for (int i = 0; i < 5000; ++i) {  // across keystream blocks
    const double x = *c.uniform();
    REQUIRE(x >= 0.0);
    REQUIRE(x < 1.0);
    REQUIRE(x == *d.uniform());
  }
}

TEST_CASE("skellam: symmetric noise of the asked variance, mod 2^bits") {
  const double variance = 2500.0;
  std::vector<uint32_t> v(40000, 0u);
  auto s = SecureStream::keyed(key_of(3));
  REQUIRE(add_skellam(v, variance, 32, s).ok());
  double sum = 0, sum2 = 0;
  for (uint32_t x : v) {
    const double y = static_cast<int32_t>(x);  // two's complement lift
    sum += y;
    sum2 += y * y;
  }
  const double mean = sum / v.size(), var = sum2 / v.size() - mean * mean;
  CHECK(std::abs(mean) < 5 * std::sqrt(variance / v.size()));
  CHECK(std::abs(var / variance - 1) < 0.05);
  // Sensitivities: L2 inflated by sqrt(dim) for the rounding, L1 <= L2 min(sqrt(d), L2).
  const Sensitivity sens = rounded_sensitivity(1.0, 1000.0, 10000);
  CHECK(sens.l2 == Approx(1100.0));
  CHECK(sens.l1 == Approx(1100.0 * 100.0));
}

TEST_CASE("skellam: the noise survives secure aggregation into the unmasked sum") {
  // 6 clients each add noise of variance v to a zero input: the unmasked sum holds noise of
  // variance 6 v, and nothing else.
  const uint32_t n = 6, dim = 20000;
  const double v = 400.0;
  auto params = plan_round(n, 0, 0, 32, dim);
  REQUIRE(params.ok());
  std::vector<std::string> names;
  for (uint32_t i = 0; i < n; ++i) names.push_back("client-" + std::to_string(i));
  auto server = ServerSession::create(1, *params, names);
  REQUIRE(server.ok());
  std::vector<std::unique_ptr<ClientSession>> clients;
  for (uint32_t i = 0; i < n; ++i) {
    auto c = ClientSession::create(1, (*server)->setup(i));
    REQUIRE(c.ok());
    REQUIRE((*server)->receive_advertise((*c)->advertise()).ok());
    clients.push_back(std::move(*c));
  }
  REQUIRE((*server)->close_advertise().ok());
  for (auto& c : clients) {
    auto sk = c->share_keys((*server)->keys_for(c->index()));
    REQUIRE(sk.ok());
    REQUIRE((*server)->receive_share_keys(*sk).ok());
  }
  REQUIRE((*server)->close_share_keys().ok());
  for (auto& c : clients) {
    std::vector<uint32_t> x(dim, 0u);
    auto noise = SecureStream::fresh();
    REQUIRE(noise.ok());
    REQUIRE(add_skellam(x, v, 32, *noise).ok());
    auto m = c->masked_input((*server)->ciphertexts_for(c->index()), x);
    REQUIRE(m.ok());
    REQUIRE((*server)->receive_masked_input(*m).ok());
  }
  auto request = (*server)->close_masked_input();
  REQUIRE(request.ok());
  for (auto& c : clients) {
    auto shares = c->unmask(*request);
    REQUIRE(shares.ok());
    REQUIRE((*server)->receive_unmask_shares(*shares).ok());
  }
  auto sum = (*server)->finish();
  REQUIRE(sum.ok());
  double s2 = 0;
  for (uint32_t x : *sum) {
    const double y = static_cast<int32_t>(x);
    s2 += y * y;
  }
  CHECK(std::abs(s2 / dim / (n * v) - 1) < 0.05);
}

}  // namespace starling::secagg
