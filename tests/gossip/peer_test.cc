// Gossip peers over real mutual TLS on 127.0.0.1, all in one io_context: exact averaging,
// CHOCO and push-pull over the wire, a crash and a rejoin with catch-up, and a peer whose
// certificate is not a peer's.
#include "gossip/peer.h"

#include <catch2/catch.hpp>
#include <cmath>

#include "core/net/tls.h"
#include "tests/testing/loopback.h"
#include "tests/testing/tls_fixtures.h"

using namespace starling;
using namespace starling::gossip;
using std::chrono::milliseconds;

namespace {

struct Net {
  asio::io_context io;
  testing::TestPki pki;
  std::vector<std::unique_ptr<Peer>> peers;
  std::vector<std::vector<PeerRoundReport>> reports;
  int dim = 16;

  PeerOptions options(Algorithm a, TopologyKind k, uint32_t rounds) const {
    PeerOptions o;
    o.heartbeat = milliseconds(40);
    o.fail_timeout = milliseconds(400);
    o.round_timeout = milliseconds(3000);
    o.linger = milliseconds(300);
    o.num_rounds = rounds;
    o.node.algorithm = a;
    o.topology.kind = k;
    return o;
  }

  // Peer `i` starts at value i in every coordinate.
  Peer& add(int i, PeerOptions o, net::CertRole role = net::CertRole::kPeer) {
    const std::string id = "peer-" + std::to_string(i);
    const auto node = pki.issue(id, role);
    net::TlsConfig t{pki.ca_pem(), node.cert_pem, node.key_pem, "", true};
    auto sctx = net::make_tls_context(t, net::TlsSide::kServer);
    auto cctx = net::make_tls_context(t, net::TlsSide::kClient);
    REQUIRE(sctx.ok());
    REQUIRE(cctx.ok());
    o.node_id = id;
    o.seed = static_cast<uint64_t>(i) + 1;
    o.node.seed = o.seed;
    if (static_cast<size_t>(i) >= reports.size()) reports.resize(static_cast<size_t>(i) + 1);
    auto p = Peer::create(io, *sctx, *cctx, o, compress::flat_layout(dim),
                          std::vector<float>(static_cast<size_t>(dim), static_cast<float>(i)),
                          nullptr, [this, i](const PeerRoundReport& r, std::span<const float>) {
                            reports[static_cast<size_t>(i)].push_back(r);
                          });
    REQUIRE(p.ok());
    if (static_cast<size_t>(i) >= peers.size()) peers.resize(static_cast<size_t>(i) + 1);
    peers[static_cast<size_t>(i)] = std::move(*p);
    peers[static_cast<size_t>(i)]->start();
    return *peers[static_cast<size_t>(i)];
  }

  std::string seed() const { return "127.0.0.1:" + std::to_string(peers[0]->port()); }

  bool all_done() const {
    for (const auto& p : peers) {
      if (p && !p->done()) return false;
    }
    return true;
  }
};

}  // namespace

TEST_CASE("peer: four peers over mutual TLS reach the exact mean (complete graph)",
          "[gossip][net]") {
  Net net;
  auto o = net.options(Algorithm::kDpsgd, TopologyKind::kComplete, 3);
  o.min_peers = 4;
  net.add(0, o);
  o.seeds = {net.seed()};
  for (int i = 1; i < 4; ++i) net.add(i, o);
  REQUIRE(testing::run_until(net.io, milliseconds(15000), [&] { return net.all_done(); }));
  for (int i = 0; i < 4; ++i) {
    INFO("peer " << i);
    REQUIRE(net.peers[static_cast<size_t>(i)]->error().ok());
    REQUIRE(net.reports[static_cast<size_t>(i)].size() == 3);
    REQUIRE(net.reports[static_cast<size_t>(i)][0].mixed == 3);
    // (0 + 1 + 2 + 3) / 4 with weights 1/4: exact.
    for (float v : net.peers[static_cast<size_t>(i)]->params()) REQUIRE(v == 1.5f);
    REQUIRE(net.peers[static_cast<size_t>(i)]->bytes_sent() > 3u * 3u * 64u);
  }
}

TEST_CASE("peer: CHOCO with top-k and push-pull over the wire reach agreement", "[gossip][net]") {
  const Algorithm a = GENERATE(Algorithm::kChoco, Algorithm::kPushPull);
  Net net;
  net.dim = 64;
  auto o = net.options(a, TopologyKind::kExponential, a == Algorithm::kChoco ? 120 : 60);
  o.min_peers = 5;
  if (a == Algorithm::kChoco) {
    o.node.codec = "topk:ratio=0.25";
    o.node.consensus_step = 0.4;
  }
  net.add(0, o);
  o.seeds = {net.seed()};
  for (int i = 1; i < 5; ++i) net.add(i, o);
  REQUIRE(testing::run_until(net.io, milliseconds(30000), [&] { return net.all_done(); }));
  double lo = 1e9, hi = -1e9, sum = 0.0;
  for (int i = 0; i < 5; ++i) {
    REQUIRE(net.peers[static_cast<size_t>(i)]->error().ok());
    for (float v : net.peers[static_cast<size_t>(i)]->params()) {
      lo = std::min(lo, static_cast<double>(v));
      hi = std::max(hi, static_cast<double>(v));
      sum += v;
    }
  }
  std::string detail;
  for (int i = 0; i < 5; ++i) {
    size_t mixed = 0;
    for (const auto& r : net.reports[static_cast<size_t>(i)]) mixed += r.mixed;
    detail += " peer-" + std::to_string(i) + ": " +
              std::to_string(net.peers[static_cast<size_t>(i)]->params()[0]) + " after " +
              std::to_string(mixed) + " mixed;";
  }
  INFO(algorithm_name(a) << ": values in [" << lo << ", " << hi << "]" << detail);
  REQUIRE(hi - lo < 0.05);
  if (a == Algorithm::kChoco) {
    // Symmetric weights keep the mean (0 + 1 + 2 + 3 + 4) / 5.
    REQUIRE(sum / (5.0 * net.dim) == Approx(2.0).margin(1e-3));
  } else {
    REQUIRE(sum / (5.0 * net.dim) == Approx(2.0).margin(0.5));
  }
}

TEST_CASE("peer: a crashed peer is dropped, and restarted it rejoins and catches up",
          "[gossip][net]") {
  Net net;
  auto o = net.options(Algorithm::kDpsgd, TopologyKind::kRing, 40);
  o.min_peers = 4;
  o.round_interval = milliseconds(40);
  net.add(0, o);
  o.seeds = {net.seed()};
  for (int i = 1; i < 4; ++i) net.add(i, o);
  REQUIRE(
      testing::run_until(net.io, milliseconds(15000), [&] { return net.reports[2].size() >= 5; }));
  net.peers[2].reset();  // crash: connections torn down, heartbeats stop
  REQUIRE(testing::run_until(net.io, milliseconds(15000), [&] {
    return net.peers[0]->live_members().size() == 3 && net.peers[1]->live_members().size() == 3;
  }));
  const size_t at_crash = net.reports[0].size();
  REQUIRE(testing::run_until(net.io, milliseconds(15000),
                             [&] { return net.reports[0].size() >= at_crash + 5; }));
  // The survivors kept going, now mixing on a ring of three.
  REQUIRE(net.reports[0].back().live_members == 3);
  o.num_rounds = 40;
  net.reports[2].clear();
  net.add(2, o);  // restart with the same identity
  REQUIRE(testing::run_until(net.io, milliseconds(30000), [&] { return net.all_done(); }));
  for (int i = 0; i < 4; ++i) REQUIRE(net.peers[static_cast<size_t>(i)]->error().ok());
  // It caught up from a neighbour's model and round, then finished the remaining rounds.
  REQUIRE(!net.reports[2].empty());
  REQUIRE(net.reports[2].front().caught_up);
  REQUIRE(net.reports[2].front().round > 5);
  REQUIRE(net.reports[2].back().round == 40);
  double lo = 1e9, hi = -1e9;
  for (int i = 0; i < 4; ++i) {
    for (float v : net.peers[static_cast<size_t>(i)]->params()) {
      lo = std::min(lo, static_cast<double>(v));
      hi = std::max(hi, static_cast<double>(v));
    }
  }
  REQUIRE(hi - lo < 1e-3);
}

TEST_CASE("peer: a node whose certificate is not a peer's is refused", "[gossip][net]") {
  Net net;
  auto o = net.options(Algorithm::kDpsgd, TopologyKind::kRing, 2);
  o.min_peers = 2;
  net.add(0, o);
  o.seeds = {net.seed()};
  net.add(1, o, net::CertRole::kClient);
  testing::run_until(net.io, milliseconds(600), [] { return false; });
  REQUIRE(net.peers[0]->live_members() == std::vector<std::string>{"peer-0"});
  REQUIRE(net.peers[1]->live_members() == std::vector<std::string>{"peer-1"});
  REQUIRE(net.peers[0]->rounds_completed() == 0);
}
