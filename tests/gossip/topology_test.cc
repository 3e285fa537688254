// Topologies: neighbour lists, Metropolis-Hastings weights, spectral gaps against closed forms.
#include "gossip/topology.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <numbers>

using namespace starling;
using namespace starling::gossip;

namespace {

TopologySpec spec(TopologyKind k, bool tv = false) {
  TopologySpec s;
  s.kind = k;
  s.time_varying = tv;
  return s;
}

void require_doubly_stochastic(const MixingMatrix& w) {
  std::vector<double> col(static_cast<size_t>(w.n), 0.0);
  for (int i = 0; i < w.n; ++i) {
    double row = 0.0;
    const auto& r = w.rows[static_cast<size_t>(i)];
    for (size_t k = 0; k < r.nodes.size(); ++k) {
      REQUIRE(r.weights[k] >= 0.0);
      row += r.weights[k];
      col[static_cast<size_t>(r.nodes[k])] += r.weights[k];
    }
    REQUIRE(row == Approx(1.0).margin(1e-12));
  }
  for (double c : col) REQUIRE(c == Approx(1.0).margin(1e-12));
}

}  // namespace

TEST_CASE("topology: neighbour lists and degrees of each graph", "[gossip]") {
  auto ring = neighbours(spec(TopologyKind::kRing), 8, 0);
  REQUIRE(ring.ok());
  REQUIRE((*ring)[0] == std::vector<int>{1, 7});
  for (const auto& nb : *ring) REQUIRE(nb.size() == 2);

  auto torus = neighbours(spec(TopologyKind::kTorus), 16, 0);
  REQUIRE(torus.ok());
  REQUIRE((*torus)[0] == std::vector<int>{1, 3, 4, 12});
  for (const auto& nb : *torus) REQUIRE(nb.size() == 4);

  auto expo = neighbours(spec(TopologyKind::kExponential), 16, 0);
  REQUIRE(expo.ok());
  // Hops 1, 2, 4, 8 both ways: +-1, +-2, +-4 and 8.
  REQUIRE((*expo)[0] == std::vector<int>{1, 2, 4, 8, 12, 14, 15});

  auto complete = neighbours(spec(TopologyKind::kComplete), 5, 0);
  REQUIRE(complete.ok());
  for (const auto& nb : *complete) REQUIRE(nb.size() == 4);

  TopologySpec rr = spec(TopologyKind::kRandomRegular);
  rr.degree = 3;
  auto reg = neighbours(rr, 10, 0);
  REQUIRE(reg.ok());
  for (size_t i = 0; i < reg->size(); ++i) {
    REQUIRE((*reg)[i].size() == 3);
    for (int j : (*reg)[i]) {
      const auto& back = (*reg)[static_cast<size_t>(j)];
      REQUIRE(std::find(back.begin(), back.end(), static_cast<int>(i)) != back.end());
    }
  }
  // Static draws repeat; time-varying ones change with the round.
  REQUIRE(*neighbours(rr, 10, 5) == *reg);
  rr.time_varying = true;
  REQUIRE(*neighbours(rr, 10, 1) != *neighbours(rr, 10, 2));
}

TEST_CASE("topology: Metropolis-Hastings weights are symmetric and doubly stochastic", "[gossip]") {
  for (TopologyKind k : {TopologyKind::kRing, TopologyKind::kTorus, TopologyKind::kExponential,
                         TopologyKind::kRandomRegular, TopologyKind::kComplete}) {
    for (int n : {1, 2, 5, 12, 16}) {
      auto w = mixing_matrix(spec(k), n, 3);
      REQUIRE(w.ok());
      require_doubly_stochastic(*w);
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < n; ++j) REQUIRE(w->weight(i, j) == w->weight(j, i));
      }
    }
  }
  // A ring's interior weights are 1/3.
  auto w = mixing_matrix(spec(TopologyKind::kRing), 6, 0);
  REQUIRE(w->weight(2, 3) == 1.0 / 3.0);
  // The one-peer exponential graph: doubly stochastic, one sender per node, weights 1/2.
  for (uint64_t r = 0; r < 4; ++r) {
    auto tv = mixing_matrix(spec(TopologyKind::kExponential, true), 16, r);
    REQUIRE(tv.ok());
    require_doubly_stochastic(*tv);
    REQUIRE(tv->send_to[0] == std::vector<int>{1 << r});
    REQUIRE(tv->weight(1 << r, 0) == 0.5);
  }
}

TEST_CASE("topology: spectral gaps match closed forms, the exponential graph mixes faster",
          "[gossip]") {
  const double pi = std::numbers::pi;
  // Ring with weights 1/3: eigenvalues (1 + 2 cos(2 pi k / n)) / 3.
  auto ring = spectral_gap(*mixing_matrix(spec(TopologyKind::kRing), 16, 0));
  REQUIRE(ring.ok());
  REQUIRE(ring->lambda2 == Approx((1 + 2 * std::cos(2 * pi / 16)) / 3).epsilon(1e-10));
  // Complete graph: W = J / n, lambda2 = 0.
  auto complete = spectral_gap(*mixing_matrix(spec(TopologyKind::kComplete), 8, 0));
  REQUIRE(complete->lambda2 == Approx(0.0).margin(1e-12));
  // 4x4 torus with weights 1/5: eigenvalues (1 + 2 cos(2 pi a / 4) + 2 cos(2 pi b / 4)) / 5.
  auto torus = spectral_gap(*mixing_matrix(spec(TopologyKind::kTorus), 16, 0));
  REQUIRE(torus->lambda2 == Approx(3.0 / 5.0).epsilon(1e-10));
  auto expo = spectral_gap(*mixing_matrix(spec(TopologyKind::kExponential), 16, 0));
  REQUIRE(expo.ok());
  REQUIRE(expo->gap > 5 * ring->gap);
  // Not symmetric: refused.
  auto tv = spectral_gap(*mixing_matrix(spec(TopologyKind::kExponential, true), 8, 0));
  REQUIRE(tv.status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("topology: impossible shapes are errors that say why", "[gossip]") {
  REQUIRE(neighbours(spec(TopologyKind::kRing), 0, 0).status().code() ==
          StatusCode::kInvalidArgument);
  TopologySpec t = spec(TopologyKind::kTorus);
  t.torus_rows = 3;
  auto bad = neighbours(t, 16, 0);
  REQUIRE(bad.status().code() == StatusCode::kInvalidArgument);
  REQUIRE_THAT(bad.status().message(), Catch::Contains("torus_rows 3"));
  REQUIRE(parse_topology_kind("Exponential").ok());
  REQUIRE_THAT(parse_topology_kind("star").status().message(), Catch::Contains("star"));
}
