// Aggregator tiers over real mutual TLS on 127.0.0.1: a root, leaf aggregators (each an
// Aggregator in leaf mode with its link to the root, aggregator/leaf.h) and their edge clients.
// Two and three tiers of FedAvg give the flat federation's model; the root's traffic is one
// model per leaf; a leaf whose weight does not match its contributors, a client certificate
// acting as a leaf, a leaf of another CA and a leaf under a root with a rule that does not
// compose are all refused.
#include <asio/steady_timer.hpp>
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <vector>

#include "aggregator/aggregator.h"
#include "aggregator/leaf.h"
#include "edge_client/edge_client.h"
#include "tests/testing/loopback.h"
#include "tests/testing/tls_fixtures.h"

namespace starling::aggregator {
namespace {

using edge_client::EdgeClient;
using edge_client::EdgeClientOptions;
using edge_client::LocalTrainer;
using edge_client::TrainReport;
using net::CertRole;
using std::chrono::milliseconds;
using testing::run_until;
using testing::TestNode;
using testing::TestPki;

constexpr milliseconds kWait{40'000};
constexpr int64_t kNumel = 23;

compress::Layout test_layout() { return {{"w", {4, 5}, 0}, {"b", {3}, 20}}; }

std::vector<float> initial_model() {
  std::vector<float> g(kNumel);
  for (int64_t i = 0; i < kNumel; ++i)
    g[static_cast<size_t>(i)] = 0.25f * static_cast<float>(i % 7) - 0.5f;
  return g;
}

uint64_t weight_of(int k) { return 1 + static_cast<uint64_t>(k % 4) * 3; }

// Client k's update in round r depends on the model it received, so a wrong model anywhere in
// the tree shows in the result.
float delta_of(int k, uint64_t round, int64_t i, float global_i) {
  return 0.01f * static_cast<float>((i * 5 + k * 3 + static_cast<int64_t>(round)) % 11 - 5) -
         0.05f * global_i;
}

class FormulaTrainer : public LocalTrainer {
 public:
  explicit FormulaTrainer(int k) : k_(k) {}
  const compress::Layout& layout() const override { return layout_; }
  Result<TrainReport> train(std::span<const float> global, const v1::RoundPlan& plan,
                            std::span<float> delta) override {
    for (int64_t i = 0; i < kNumel; ++i) {
      delta[static_cast<size_t>(i)] = delta_of(k_, plan.round(), i, global[static_cast<size_t>(i)]);
    }
    ++rounds;
    TrainReport r;
    r.num_samples = weight_of(k_);
    r.loss = static_cast<float>(k_);
    return r;
  }
  int rounds = 0;

 private:
  int k_;
  compress::Layout layout_ = test_layout();
};

// FedAvg of clients `ks` for `rounds` rounds, in double.
std::vector<double> expected_fedavg(const std::vector<int>& ks, uint64_t rounds) {
  const auto init = initial_model();
  std::vector<double> g(init.begin(), init.end());
  for (uint64_t r = 1; r <= rounds; ++r) {
    std::vector<double> sum(kNumel, 0.0);
    double w = 0;
    for (int k : ks) {
      for (int64_t i = 0; i < kNumel; ++i) {
        sum[static_cast<size_t>(i)] +=
            static_cast<double>(weight_of(k)) *
            delta_of(k, r, i, static_cast<float>(g[static_cast<size_t>(i)]));
      }
      w += static_cast<double>(weight_of(k));
    }
    for (int64_t i = 0; i < kNumel; ++i)
      g[static_cast<size_t>(i)] += sum[static_cast<size_t>(i)] / w;
  }
  return g;
}

double max_relative_error(std::span<const float> got, const std::vector<double>& want) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::max(1.0, std::abs(want[i])));
  }
  return worst;
}

// Runs `io` for `d` (what a refused node would have done by then).
void run_for(asio::io_context& io, milliseconds d) {
  asio::steady_timer t(io);
  bool waited = false;
  t.expires_after(d);
  t.async_wait([&](const asio::error_code&) { waited = true; });
  REQUIRE(run_until(io, kWait, [&] { return waited; }));
}

net::TlsConfig tls_of(const TestPki& pki, const TestNode& node) {
  return net::TlsConfig{pki.ca_pem(), node.cert_pem, node.key_pem, "", true};
}

std::shared_ptr<asio::ssl::context> ctx_of(const TestPki& pki, const TestNode& node,
                                           net::TlsSide side) {
  auto ctx = net::make_tls_context(tls_of(pki, node), side);
  REQUIRE(ctx.ok());
  return *ctx;
}

AggregatorOptions aggregator_options(int contributors, uint32_t rounds) {
  AggregatorOptions o;
  o.num_rounds = rounds;
  o.clients_per_round = static_cast<uint32_t>(contributors);
  o.min_available = static_cast<uint32_t>(contributors);
  o.round_deadline = milliseconds(15'000);
  o.codec = "identity";
  o.heartbeat_interval = milliseconds(0);
  o.server.connection.deadlines.handshake = milliseconds(2000);
  return o;
}

EdgeClientOptions link_options(const std::string& name, uint16_t port, uint64_t seed) {
  EdgeClientOptions o;
  o.connect.host = "127.0.0.1";
  o.connect.port = port;
  o.connect.server_name = "localhost";
  o.node_id = name;
  o.backoff.initial = milliseconds(10);
  o.backoff.max = milliseconds(100);
  o.seed = seed;
  o.chunk_bytes = 32;  // several chunks per transfer
  o.heartbeat_interval = milliseconds(0);
  return o;
}

// A federation's nodes, all on one io_context (each leaf's link runs on a thread of its own).
struct Tree {
  TestPki pki;
  TestNode root_cert = pki.issue("root", CertRole::kServer);
  std::unique_ptr<Aggregator> root;
  std::vector<RoundReport> root_reports;

  struct LeafNode {
    std::unique_ptr<Aggregator> agg;
    std::unique_ptr<Leaf> link;
  };
  std::vector<LeafNode> leaves;
  std::vector<std::unique_ptr<FormulaTrainer>> trainers;
  std::vector<std::unique_ptr<EdgeClient>> clients;

  void start_root(asio::io_context& io, AggregatorOptions o) {
    o.node_id = "root";
    auto agg = Aggregator::create(io, ctx_of(pki, root_cert, net::TlsSide::kServer), std::move(o),
                                  test_layout(), initial_model(),
                                  [this](const RoundReport& r, std::span<const float>) {
                                    root_reports.push_back(r);
                                    return true;
                                  });
    REQUIRE(agg.ok());
    root = std::move(*agg);
  }

  // A leaf named `name` under the aggregator at `up_port`, taking `contributors` per round.
  Aggregator& start_leaf(asio::io_context& io, const std::string& name, uint16_t up_port,
                         int contributors) {
    const TestNode cert = pki.issue(name, CertRole::kLeaf);
    AggregatorOptions o = aggregator_options(contributors, 1);
    o.leaf = true;
    o.node_id = name;
    auto agg = Aggregator::create(io, ctx_of(pki, cert, net::TlsSide::kServer), std::move(o),
                                  test_layout(), initial_model());
    REQUIRE(agg.ok());
    LeafOptions lo;
    lo.upstream = link_options(name, up_port, 99);
    auto link = Leaf::start(io, **agg, test_layout(), ctx_of(pki, cert, net::TlsSide::kClient), lo);
    REQUIRE(link.ok());
    leaves.push_back({std::move(*agg), std::move(*link)});
    return *leaves.back().agg;
  }

  void start_client(asio::io_context& io, int k, uint16_t port) {
    const std::string name = "client-" + std::to_string(k);
    const TestNode cert = pki.issue(name, CertRole::kClient);
    trainers.push_back(std::make_unique<FormulaTrainer>(k));
    clients.push_back(std::make_unique<EdgeClient>(
        io, ctx_of(pki, cert, net::TlsSide::kClient),
        link_options(name, port, static_cast<uint64_t>(k) + 1), *trainers.back()));
    clients.back()->start();
  }

  // Runs until the root is done, ending each leaf's federation once its link stops (as
  // `starling aggregator` does), and until every client heard that the federation is complete.
  bool run(asio::io_context& io) {
    std::vector<bool> ended(leaves.size(), false);
    return run_until(io, kWait, [&] {
      for (size_t i = 0; i < leaves.size(); ++i) {
        if (!ended[i] && leaves[i].link->stopped()) {
          leaves[i].agg->end_federation();
          ended[i] = true;
        }
      }
      return root->done() && std::all_of(ended.begin(), ended.end(), [](bool e) { return e; }) &&
             std::all_of(clients.begin(), clients.end(),
                         [](const auto& c) { return c->stopped(); });
    });
  }
};

// The same clients straight under one aggregator.
std::vector<float> flat_federation(const std::vector<int>& ks, uint32_t rounds) {
  asio::io_context io;
  Tree flat;
  flat.start_root(io, aggregator_options(static_cast<int>(ks.size()), rounds));
  for (int k : ks) flat.start_client(io, k, flat.root->port());
  REQUIRE(flat.run(io));
  REQUIRE(flat.root->error().ok());
  return {flat.root->global().begin(), flat.root->global().end()};
}

TEST_CASE(
    "two tiers of FedAvg give the flat federation's model, and the root moves one model a leaf",
    "[net][tiers]") {
  constexpr uint32_t kRounds = 3;
  std::vector<int> all(12);
  for (int k = 0; k < 12; ++k) all[static_cast<size_t>(k)] = k;
  const std::vector<float> flat = flat_federation(all, kRounds);

  asio::io_context io;
  Tree tree;
  tree.start_root(io, aggregator_options(3, kRounds));
  for (int l = 0; l < 3; ++l) {
    Aggregator& leaf = tree.start_leaf(io, "leaf-" + std::to_string(l), tree.root->port(), 4);
    for (int k = 4 * l; k < 4 * l + 4; ++k) tree.start_client(io, k, leaf.port());
  }
  REQUIRE(tree.run(io));
  REQUIRE(tree.root->error().ok());
  CHECK(tree.root->rounds_completed() == kRounds);

  const auto want = expected_fedavg(all, kRounds);
  CHECK(max_relative_error(tree.root->global(), want) < 1e-6);
  CHECK(max_relative_error(flat, want) < 1e-6);
  std::vector<double> flat_d(flat.begin(), flat.end());
  CHECK(max_relative_error(tree.root->global(), flat_d) < 1e-6);

  // The root saw three contributors a round carrying all twelve clients' weight, and received
  // three models' worth of bytes, not twelve.
  REQUIRE(tree.root_reports.size() == kRounds);
  double total_weight = 0;
  for (int k = 0; k < 12; ++k) total_weight += static_cast<double>(weight_of(k));
  for (const auto& r : tree.root_reports) {
    CHECK(r.updates == 3);
    CHECK(r.rejected == 0);
    CHECK(r.total_weight == total_weight);
    CHECK(r.update_bytes >= 3 * kNumel * 4);
    CHECK(r.update_bytes < 4 * kNumel * 4 + 3 * 1024);
  }
  for (const auto& t : tree.trainers) CHECK(t->rounds == static_cast<int>(kRounds));
  for (const auto& l : tree.leaves) {
    CHECK(l.link->finished());
    CHECK(l.link->rounds() == static_cast<int>(kRounds));
  }
}

TEST_CASE("three tiers, with clients at every level, give the flat federation's model",
          "[net][tiers]") {
  constexpr uint32_t kRounds = 2;
  asio::io_context io;
  Tree tree;
  // root <- {client 0, client 1, mid}; mid <- {client 2, client 3, low}; low <- {4, 5, 6, 7}.
  tree.start_root(io, aggregator_options(3, kRounds));
  tree.start_client(io, 0, tree.root->port());
  tree.start_client(io, 1, tree.root->port());
  Aggregator& mid = tree.start_leaf(io, "leaf-mid", tree.root->port(), 3);
  tree.start_client(io, 2, mid.port());
  tree.start_client(io, 3, mid.port());
  Aggregator& low = tree.start_leaf(io, "leaf-low", mid.port(), 4);
  for (int k = 4; k < 8; ++k) tree.start_client(io, k, low.port());
  REQUIRE(tree.run(io));
  REQUIRE(tree.root->error().ok());
  const auto want = expected_fedavg({0, 1, 2, 3, 4, 5, 6, 7}, kRounds);
  CHECK(max_relative_error(tree.root->global(), want) < 1e-6);
  for (const auto& r : tree.root_reports) CHECK(r.updates == 3);
}

TEST_CASE("FedBuff at the root takes each leaf's partial mean as one buffered update",
          "[net][tiers][fedbuff]") {
  asio::io_context io;
  Tree tree;
  AggregatorOptions o = aggregator_options(2, 3);
  o.buffer_size = 2;
  tree.start_root(io, o);
  for (int l = 0; l < 2; ++l) {
    Aggregator& leaf = tree.start_leaf(io, "leaf-" + std::to_string(l), tree.root->port(), 2);
    for (int k = 2 * l; k < 2 * l + 2; ++k) tree.start_client(io, k, leaf.port());
  }
  REQUIRE(tree.run(io));
  REQUIRE(tree.root->error().ok());
  CHECK(tree.root->rounds_completed() == 3);
  REQUIRE(tree.root_reports.size() == 3);
  for (const auto& r : tree.root_reports) CHECK(r.updates == 2);
  // The model moved, and stayed finite.
  const auto init = initial_model();
  bool moved = false;
  for (size_t i = 0; i < init.size(); ++i) {
    CHECK(std::isfinite(tree.root->global()[i]));
    moved = moved || tree.root->global()[i] != init[i];
  }
  CHECK(moved);
}

// A leaf that lies: its upload's weight and contributions as `report` says, whatever it folded.
class LyingLeafTrainer : public LocalTrainer {
 public:
  LyingLeafTrainer(uint64_t weight, std::vector<v1::Contribution> contributions)
      : weight_(weight), contributions_(std::move(contributions)) {}
  const compress::Layout& layout() const override { return layout_; }
  Result<TrainReport> train(std::span<const float>, const v1::RoundPlan&,
                            std::span<float> delta) override {
    std::fill(delta.begin(), delta.end(), 1.0f);
    return TrainReport{weight_, 0.0f};
  }
  std::vector<v1::Contribution> take_contributions() override { return contributions_; }

 private:
  uint64_t weight_;
  std::vector<v1::Contribution> contributions_;
  compress::Layout layout_ = test_layout();
};

v1::Contribution contribution(const std::string& name, uint64_t weight) {
  v1::Contribution c;
  c.set_node_id(name);
  c.set_num_samples(weight);
  return c;
}

TEST_CASE("the root refuses a leaf's partial sum whose weight does not match its contributors",
          "[net][tiers]") {
  struct Lie {
    const char* what;
    uint64_t weight;
    std::vector<v1::Contribution> contributions;
  };
  const std::vector<Lie> lies = {
      {"weight above its clients'", 1000, {contribution("a", 10), contribution("b", 20)}},
      {"no contributors", 30, {}},
      {"a client twice", 20, {contribution("a", 10), contribution("a", 10)}},
      {"a client weight out of range",
       (1ull << 25) + 1,
       {contribution("a", 1ull << 25), contribution("b", 1)}},
  };
  for (const auto& lie : lies) {
    SECTION(lie.what) {
      asio::io_context io;
      Tree tree;
      AggregatorOptions o = aggregator_options(2, 1);
      o.min_updates = 1;
      o.round_deadline = milliseconds(3000);
      tree.start_root(io, o);
      tree.start_client(io, 0, tree.root->port());  // an honest client keeps the round going
      const TestNode cert = tree.pki.issue("leaf-liar", CertRole::kLeaf);
      LyingLeafTrainer trainer(lie.weight, lie.contributions);
      auto lo = link_options("leaf-liar", tree.root->port(), 7);
      lo.role = v1::ROLE_LEAF;
      EdgeClient liar(io, ctx_of(tree.pki, cert, net::TlsSide::kClient), lo, trainer);
      liar.start();
      REQUIRE(run_until(io, kWait, [&] { return tree.root->done(); }));
      REQUIRE(tree.root_reports.size() == 1);
      CHECK(tree.root_reports[0].updates == 1);
      CHECK(tree.root_reports[0].rejected == 1);
      CHECK(tree.root_reports[0].total_weight == static_cast<double>(weight_of(0)));
      // The model moved by the honest client's update alone.
      CHECK(max_relative_error(tree.root->global(), expected_fedavg({0}, 1)) < 1e-6);
    }
  }
}

TEST_CASE("a client may not list contributions, and may not count twice through a leaf",
          "[net][tiers]") {
  asio::io_context io;
  Tree tree;
  AggregatorOptions o = aggregator_options(2, 1);
  o.round_deadline = milliseconds(3000);
  tree.start_root(io, o);
  tree.start_client(io, 0, tree.root->port());
  // client-1 claims, as a client, to carry others' updates.
  const TestNode cert = tree.pki.issue("client-1", CertRole::kClient);
  LyingLeafTrainer trainer(30, {contribution("x", 30)});
  EdgeClient pretender(io, ctx_of(tree.pki, cert, net::TlsSide::kClient),
                       link_options("client-1", tree.root->port(), 3), trainer);
  pretender.start();
  REQUIRE(run_until(io, kWait, [&] { return tree.root->done(); }));
  REQUIRE(tree.root_reports.size() == 1);
  CHECK(tree.root_reports[0].updates == 1);
  CHECK(tree.root_reports[0].rejected == 1);
}

TEST_CASE("a client certificate cannot act as a leaf, nor a leaf of another federation join",
          "[net][tiers]") {
  asio::io_context io;
  Tree tree;
  tree.start_root(io, aggregator_options(1, 1));
  FormulaTrainer trainer(0);
  // A client certificate whose Hello claims LEAF.
  const TestNode client_cert = tree.pki.issue("client-as-leaf", CertRole::kClient);
  auto lo = link_options("client-as-leaf", tree.root->port(), 5);
  lo.role = v1::ROLE_LEAF;
  EdgeClient impostor(io, ctx_of(tree.pki, client_cert, net::TlsSide::kClient), lo, trainer);
  impostor.start();
  // A leaf certificate of another CA.
  TestPki other("other-federation");
  const TestNode foreign_cert = other.issue("leaf-foreign", CertRole::kLeaf);
  auto fo = link_options("leaf-foreign", tree.root->port(), 6);
  fo.role = v1::ROLE_LEAF;
  EdgeClient foreign(io, ctx_of(other, foreign_cert, net::TlsSide::kClient), fo, trainer);
  foreign.start();
  run_for(io, milliseconds(1500));
  CHECK(tree.root->registered_clients() == 0);
  CHECK(tree.root->rounds_completed() == 0);
  CHECK(impostor.connections() >= 1);  // it got through TLS and was refused at the Hello
  CHECK(foreign.connections() == 0);   // refused at the handshake
  CHECK(trainer.rounds == 0);
}

TEST_CASE("a root whose rule does not compose across tiers refuses leaves, and says why",
          "[net][tiers]") {
  asio::io_context io;
  Tree tree;
  AggregatorOptions o = aggregator_options(1, 1);
  o.rule.rule = RobustRule::kMedian;
  tree.start_root(io, o);
  Aggregator& leaf = tree.start_leaf(io, "leaf-0", tree.root->port(), 1);
  tree.start_client(io, 0, leaf.port());
  run_for(io, milliseconds(1500));
  CHECK(tree.root->registered_clients() == 0);
  CHECK(tree.root->rounds_completed() == 0);
  CHECK(tree.trainers[0]->rounds == 0);
}

TEST_CASE("a leaf refuses DP, secure aggregation and FedBuff at create", "[tiers]") {
  asio::io_context io;
  TestPki pki;
  const TestNode cert = pki.issue("leaf", CertRole::kLeaf);
  AggregatorOptions o = aggregator_options(1, 1);
  o.leaf = true;
  o.buffer_size = 4;
  auto agg = Aggregator::create(io, ctx_of(pki, cert, net::TlsSide::kServer), o, test_layout(),
                                initial_model());
  REQUIRE_FALSE(agg.ok());
  CHECK_THAT(agg.status().message(), Catch::Contains("leaf"));
}

}  // namespace
}  // namespace starling::aggregator
