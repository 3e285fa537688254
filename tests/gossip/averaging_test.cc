// Gossip averaging through the in-process exchange (codecs included): exact means where the
// arithmetic is exact, convergence to the mean elsewhere, and the consensus decay rate that the
// spectral gap predicts.
#include <catch2/catch.hpp>
#include <cmath>

#include "core/util/rng.h"
#include "gossip/simulation.h"

using namespace starling;
using namespace starling::gossip;

namespace {

// Node i holds small integers i * 8 + (k mod 8): every partial sum and every product by a power
// of two is exact in float.
std::vector<std::vector<float>> integer_models(int n, int dim) {
  std::vector<std::vector<float>> x(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < dim; ++k)
      x[static_cast<size_t>(i)].push_back(static_cast<float>(i * 8 + k % 8));
  }
  return x;
}

std::vector<double> exact_mean(const std::vector<std::vector<float>>& x) {
  std::vector<double> m(x[0].size(), 0.0);
  for (const auto& v : x) {
    for (size_t k = 0; k < v.size(); ++k) m[k] += v[k];
  }
  for (double& v : m) v /= static_cast<double>(x.size());
  return m;
}

std::unique_ptr<Simulation> make(Algorithm a, TopologySpec t, std::vector<std::vector<float>> x,
                                 std::string codec = "identity", double gamma = 1.0) {
  SimulationOptions o;
  o.node.algorithm = a;
  o.node.codec = std::move(codec);
  o.node.consensus_step = gamma;
  o.topology = t;
  const int64_t dim = static_cast<int64_t>(x[0].size());
  auto sim = Simulation::create(o, compress::flat_layout(dim), std::move(x), {});
  REQUIRE(sim.ok());
  return std::move(*sim);
}

double max_error(const Simulation& sim, const std::vector<double>& mean) {
  double e = 0.0;
  for (int i = 0; i < sim.num_nodes(); ++i) {
    const auto x = sim.params(i);
    for (size_t k = 0; k < x.size(); ++k) e = std::max(e, std::abs(x[k] - mean[k]));
  }
  return e;
}

}  // namespace

TEST_CASE("averaging: exact mean, bit for bit, where the arithmetic is exact", "[gossip]") {
  SECTION("complete graph of 8: one D-PSGD step (weights 1/8)") {
    auto x = integer_models(8, 16);
    const auto mean = exact_mean(x);
    TopologySpec t;
    t.kind = TopologyKind::kComplete;
    auto sim = make(Algorithm::kDpsgd, t, x);
    REQUIRE(sim->gossip_step().ok());
    for (int i = 0; i < 8; ++i) {
      for (size_t k = 0; k < mean.size(); ++k)
        REQUIRE(sim->params(i)[k] == static_cast<float>(mean[k]));
    }
    REQUIRE(sim->consensus_distance() == 0.0);
  }
  SECTION("one-peer exponential graph: exact after log2 n steps") {
    const int n = GENERATE(2, 8, 16);
    auto x = integer_models(n, 8);
    const auto mean = exact_mean(x);
    TopologySpec t;
    t.kind = TopologyKind::kExponential;
    t.time_varying = true;
    auto sim = make(Algorithm::kDpsgd, t, x);
    int steps = 0;
    for (int m = 1; m < n; m *= 2) {
      REQUIRE(sim->consensus_distance() > 0.0);
      REQUIRE(sim->gossip_step().ok());
      ++steps;
    }
    for (int i = 0; i < n; ++i) {
      for (size_t k = 0; k < mean.size(); ++k)
        REQUIRE(sim->params(i)[k] == static_cast<float>(mean[k]));
    }
    // One message per node per step, identity-coded: 8 floats plus framing.
    REQUIRE(sim->bytes_sent(0) > static_cast<uint64_t>(steps) * 32);
  }
  SECTION("random 3-regular graph: one step equals the exact weighted sum (weights 1/4)") {
    auto x = integer_models(10, 8);
    TopologySpec t;
    t.kind = TopologyKind::kRandomRegular;
    t.degree = 3;
    auto adj = *neighbours(t, 10, 0);
    auto sim = make(Algorithm::kDpsgd, t, x);
    REQUIRE(sim->gossip_step().ok());
    for (int i = 0; i < 10; ++i) {
      for (size_t k = 0; k < 8; ++k) {
        double want = x[static_cast<size_t>(i)][k];
        for (int j : adj[static_cast<size_t>(i)]) want += x[static_cast<size_t>(j)][k];
        REQUIRE(sim->params(i)[k] == static_cast<float>(want / 4));
      }
    }
  }
}

TEST_CASE("averaging: every topology and algorithm converges to the mean", "[gossip]") {
  const int n = 16;
  auto x = integer_models(n, 32);
  const auto mean = exact_mean(x);
  struct Case {
    TopologyKind kind;
    Algorithm algorithm;
    std::string codec;
    double gamma;
    int steps;
  };
  const Case c =
      GENERATE(Case{TopologyKind::kRing, Algorithm::kDpsgd, "identity", 1.0, 400},
               Case{TopologyKind::kTorus, Algorithm::kDpsgd, "identity", 1.0, 150},
               Case{TopologyKind::kExponential, Algorithm::kDpsgd, "identity", 1.0, 60},
               Case{TopologyKind::kRandomRegular, Algorithm::kDpsgd, "identity", 1.0, 80},
               Case{TopologyKind::kRing, Algorithm::kPushPull, "identity", 1.0, 400},
               Case{TopologyKind::kExponential, Algorithm::kChoco, "topk:ratio=0.25", 0.4, 400});
  TopologySpec t;
  t.kind = c.kind;
  auto sim = make(c.algorithm, t, x, c.codec, c.gamma);
  const double d0 = sim->consensus_distance();
  for (int s = 0; s < c.steps; ++s) REQUIRE(sim->gossip_step().ok());
  INFO(topology_name(c.kind) << " " << algorithm_name(c.algorithm) << " distance "
                             << sim->consensus_distance() << " from " << d0);
  REQUIRE(sim->consensus_distance() < 1e-4 * d0);
  REQUIRE(max_error(*sim, mean) < 1e-3);
}

TEST_CASE("averaging: consensus distance decays at the rate the spectral gap predicts",
          "[gossip]") {
  const int n = 16;
  std::vector<std::vector<float>> x(n);
  Rng rng(7);
  for (auto& v : x) {
    for (int k = 0; k < 64; ++k) v.push_back(static_cast<float>(rng.normal()));
  }
  auto rate = [&](TopologyKind kind, int from, int to) {
    TopologySpec t;
    t.kind = kind;
    auto sim = make(Algorithm::kDpsgd, t, x);
    double d_from = 0.0;
    for (int s = 0; s < to; ++s) {
      if (s == from) d_from = sim->consensus_distance();
      REQUIRE(sim->gossip_step().ok());
    }
    return std::pow(sim->consensus_distance() / d_from, 1.0 / (to - from));
  };
  TopologySpec ring_t, exp_t;
  ring_t.kind = TopologyKind::kRing;
  exp_t.kind = TopologyKind::kExponential;
  const double ring_lambda = spectral_gap(*mixing_matrix(ring_t, n, 0))->lambda2;
  const double exp_lambda = spectral_gap(*mixing_matrix(exp_t, n, 0))->lambda2;
  const double ring_rate = rate(TopologyKind::kRing, 40, 120);
  const double exp_rate = rate(TopologyKind::kExponential, 4, 14);
  INFO("ring lambda2 " << ring_lambda << " measured " << ring_rate << "; exponential lambda2 "
                       << exp_lambda << " measured " << exp_rate);
  REQUIRE(ring_rate == Approx(ring_lambda).epsilon(0.01));
  REQUIRE(exp_rate <= exp_lambda * 1.02);
  REQUIRE(exp_rate > 0.5 * exp_lambda);
  REQUIRE(exp_rate < ring_rate);
}

TEST_CASE("averaging: a crashed node is dropped, a rejoined one catches up from a neighbour",
          "[gossip]") {
  auto x = integer_models(8, 16);
  TopologySpec t;
  t.kind = TopologyKind::kRing;
  auto sim = make(Algorithm::kDpsgd, t, x);
  for (int s = 0; s < 3; ++s) REQUIRE(sim->gossip_step().ok());
  REQUIRE(sim->crash(3).ok());
  REQUIRE(sim->crash(3).code() == StatusCode::kFailedPrecondition);
  const std::vector<float> frozen(sim->params(3).begin(), sim->params(3).end());
  for (int s = 0; s < 150; ++s) REQUIRE(sim->gossip_step().ok());
  // The crashed node did not move; the other seven agree among themselves.
  REQUIRE(std::equal(frozen.begin(), frozen.end(), sim->params(3).begin()));
  REQUIRE(sim->consensus_distance() < 1e-4);
  const uint64_t before = sim->bytes_sent(2) + sim->bytes_sent(4);
  REQUIRE(sim->rejoin(3).ok());
  // It copied a neighbour's model (4 bytes a parameter counted) and agrees at once.
  REQUIRE(sim->bytes_sent(2) + sim->bytes_sent(4) == before + 16 * 4);
  REQUIRE(sim->consensus_distance() < 1e-4);
  for (int s = 0; s < 5; ++s) REQUIRE(sim->gossip_step().ok());
  REQUIRE(sim->consensus_distance() < 1e-4);
}

TEST_CASE("averaging: CHOCO with top-k sends far fewer bytes and still agrees", "[gossip]") {
  const int n = 8;
  Rng rng(3);
  std::vector<std::vector<float>> x(n);
  for (auto& v : x) {
    for (int k = 0; k < 1000; ++k) v.push_back(static_cast<float>(rng.normal()));
  }
  TopologySpec t;
  t.kind = TopologyKind::kExponential;
  auto dense = make(Algorithm::kDpsgd, t, x);
  auto choco = make(Algorithm::kChoco, t, x, "topk:ratio=0.02", 0.05);
  const double d0 = dense->consensus_distance();
  for (int s = 0; s < 20; ++s) REQUIRE(dense->gossip_step().ok());
  for (int s = 0; s < 400; ++s) REQUIRE(choco->gossip_step().ok());
  INFO("choco " << choco->consensus_distance() << " d0 " << d0);
  REQUIRE(choco->consensus_distance() < 1e-2 * d0);
  // Top-2% of 1000: 20 values and 20 indices (8 bytes each) against 4000 bytes dense.
  const double per_dense = static_cast<double>(dense->total_bytes()) / 20;
  const double per_choco = static_cast<double>(choco->total_bytes()) / 400;
  REQUIRE(per_dense / per_choco > 15.0);
  // The mean is preserved (symmetric weights): within float rounding of the start.
  const auto m = choco->mean_params();
  std::vector<double> start(1000, 0.0);
  for (const auto& v : x) {
    for (size_t k = 0; k < v.size(); ++k) start[k] += v[k] / n;
  }
  for (size_t k = 0; k < m.size(); ++k) REQUIRE(m[k] == Approx(start[k]).margin(1e-4));
}

TEST_CASE("averaging: bad simulation setups are refused with the reason", "[gossip]") {
  SimulationOptions o;
  o.node.algorithm = Algorithm::kChoco;
  o.topology.time_varying = true;
  auto r = Simulation::create(o, compress::flat_layout(4), {std::vector<float>(4, 0.f)}, {});
  REQUIRE_THAT(r.status().message(), Catch::Contains("static topology"));
  o.topology.time_varying = false;
  o.node.codec = "topk:ratio=0.1,ef=1";
  r = Simulation::create(o, compress::flat_layout(4), {std::vector<float>(4, 0.f)}, {});
  REQUIRE_THAT(r.status().message(), Catch::Contains("ef=1"));
  o.node.algorithm = Algorithm::kDpsgd;
  o.node.codec = "nope";
  r = Simulation::create(o, compress::flat_layout(4), {std::vector<float>(4, 0.f)}, {});
  REQUIRE(r.status().code() == StatusCode::kInvalidArgument);
  o.node.codec = "identity";
  r = Simulation::create(o, compress::flat_layout(4), {std::vector<float>(3, 0.f)}, {});
  REQUIRE_THAT(r.status().message(), Catch::Contains("3 parameters"));
}

TEST_CASE("averaging: a message mixed late ends where a timely mix would have", "[gossip]") {
  // Multiples of 4 and weights 1/4: every step is exact in float.
  const int dim = 16;
  std::vector<float> xa, xb;
  for (int k = 0; k < dim; ++k) {
    xa.push_back(static_cast<float>(4 * k));
    xb.push_back(static_cast<float>(4 * (k + 3)));
  }
  NodeOptions o;
  auto make_node = [&](const std::vector<float>& x) {
    auto n = GossipNode::create(o, compress::flat_layout(dim), x);
    REQUIRE(n.ok());
    return std::move(*n);
  };
  auto a_timely = make_node(xa), a_late = make_node(xa), b = make_node(xb);
  auto to_update = [&](GossipNode& n) {
    auto bytes = n.make_message();
    REQUIRE(bytes.ok());
    auto u = parse_message(*bytes, dim, "test");
    REQUIRE(u.ok());
    return std::move(*u);
  };
  const compress::EncodedUpdate from_a = to_update(*a_timely), from_b = to_update(*b);
  const std::vector<Incoming> b_in = {{"b", &from_b, 0.25, false}};
  REQUIRE(a_timely->mix(0.75, b_in).ok());
  // a_late mixes round r without b (its weight stays with a), then b's message arrives.
  REQUIRE(a_late->mix(1.0, {}).ok());
  const std::vector<Incoming> a_in = {{"a", &from_a, 0.25, false}};
  REQUIRE(b->mix(0.75, a_in).ok());
  REQUIRE(a_late->mix_late(from_b, xa, 0.25).ok());
  for (int k = 0; k < dim; ++k) {
    const auto i = static_cast<size_t>(k);
    REQUIRE(a_late->params()[i] == a_timely->params()[i]);
    REQUIRE(a_late->params()[i] + b->params()[i] == xa[i] + xb[i]);  // the pair's sum is kept
  }
  SECTION("a model of the wrong size is refused and x is unchanged") {
    const std::vector<float> before(a_late->params().begin(), a_late->params().end());
    const Status st = a_late->mix_late(from_b, std::vector<float>(3, 0.0f), 0.25);
    REQUIRE(st.code() == StatusCode::kInvalidArgument);
    REQUIRE(std::equal(before.begin(), before.end(), a_late->params().begin()));
  }
}

TEST_CASE("learning rate: cosine decay from lr to lr * final_fraction", "[gossip]") {
  REQUIRE(scheduled_learning_rate(0.1f, 1.0f, 7, 10) == 0.1f);
  REQUIRE(scheduled_learning_rate(0.1f, 0.0f, 3, 0) == 0.1f);
  REQUIRE(scheduled_learning_rate(0.1f, 0.2f, 0, 11) == Approx(0.1));
  REQUIRE(scheduled_learning_rate(0.1f, 0.2f, 5, 11) == Approx(0.06));  // halfway: (1 + f) / 2
  REQUIRE(scheduled_learning_rate(0.1f, 0.2f, 10, 11) == Approx(0.02));
  REQUIRE(scheduled_learning_rate(0.1f, 0.2f, 50, 11) == Approx(0.02));
  float prev = 1.0f;
  for (uint64_t r = 0; r < 11; ++r) {
    const float lr = scheduled_learning_rate(0.1f, 0.0f, r, 11);
    REQUIRE(lr <= prev);
    prev = lr;
  }
}
