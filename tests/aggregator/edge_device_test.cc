// The edge client on a constrained device, against a real aggregator over mutual TLS: its
// error-feedback state survives a restart (the final model equals an uninterrupted run's), a
// training condition keeps it away until it allows, a memory limit makes it decline rounds, and
// an upload cap paces its update.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "aggregator/aggregator.h"
#include "edge_client/client_state.h"
#include "edge_client/edge_client.h"
#include "tests/testing/loopback.h"
#include "tests/testing/tls_fixtures.h"

namespace starling::aggregator {
namespace {

using edge_client::EdgeClient;
using edge_client::EdgeClientOptions;
using net::CertRole;
using std::chrono::milliseconds;
using testing::run_until;

constexpr milliseconds kWait{20'000};

// Deltas that depend only on the round, so that two runs are comparable bit for bit.
class RoundTrainer : public edge_client::LocalTrainer {
 public:
  explicit RoundTrainer(int64_t numel) : layout_{{"w", {numel}, 0}} {}
  const compress::Layout& layout() const override { return layout_; }
  Result<edge_client::TrainReport> train(std::span<const float>, const v1::RoundPlan& plan,
                                         std::span<float> delta) override {
    for (size_t i = 0; i < delta.size(); ++i) {
      delta[i] = static_cast<float>(
                     (static_cast<int64_t>(i) * 5 + static_cast<int64_t>(plan.round()) * 3) % 9) -
                 4.0f;
    }
    ++trained;
    return edge_client::TrainReport{1, 0.0f};
  }
  int trained = 0;

 private:
  compress::Layout layout_;
};

struct Fixture {
  testing::TestPki pki;
  testing::TestNode server = pki.issue("aggregator", CertRole::kServer);
  testing::TestNode node = pki.issue("client-0", CertRole::kClient);
  std::filesystem::path dir;

  Fixture() {
    dir = std::filesystem::temp_directory_path() /
          ("starling_edge_device_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  ~Fixture() { std::filesystem::remove_all(dir); }

  std::shared_ptr<asio::ssl::context> ctx(const testing::TestNode& n, net::TlsSide side) {
    auto c = net::make_tls_context({pki.ca_pem(), n.cert_pem, n.key_pem, "", true}, side);
    REQUIRE(c.ok());
    return *c;
  }

  std::unique_ptr<Aggregator> aggregator(asio::io_context& io, uint32_t rounds,
                                         const std::string& codec, int64_t numel) {
    AggregatorOptions o;
    o.num_rounds = rounds;
    o.clients_per_round = 1;
    o.min_available = 1;
    o.round_deadline = milliseconds(1000);
    o.codec = codec;
    auto agg = Aggregator::create(io, ctx(server, net::TlsSide::kServer), o, {{"w", {numel}, 0}},
                                  std::vector<float>(numel, 0.0f));
    REQUIRE(agg.ok());
    return std::move(*agg);
  }

  EdgeClientOptions client_options(uint16_t port) const {
    EdgeClientOptions o;
    o.connect.host = "127.0.0.1";
    o.connect.port = port;
    o.connect.server_name = "localhost";
    o.node_id = "client-0";
    o.backoff.initial = milliseconds(10);
    o.backoff.max = milliseconds(50);
    o.condition_poll = milliseconds(50);
    return o;
  }
};

// Three rounds of top-k with error feedback; the client is destroyed (as by SIGKILL) after
// the first round's update is acknowledged, and a new one started with the same options.
std::vector<float> run_with_restart(Fixture& f, const std::string& state_path, bool restart) {
  asio::io_context io;
  const std::string codec = "topk:ratio=0.25,ef=1";
  auto agg = f.aggregator(io, 3, codec, 16);
  RoundTrainer trainer(16);
  auto o = f.client_options(agg->port());
  o.state_path = state_path;
  auto client = std::make_unique<EdgeClient>(io, f.ctx(f.node, net::TlsSide::kClient), o, trainer);
  client->start();
  if (restart) {
    REQUIRE(run_until(io, kWait, [&] { return agg->rounds_completed() >= 1; }));
    if (!state_path.empty()) {
      // Saved when the aggregator acknowledged the update.
      REQUIRE(run_until(io, kWait, [&] {
        auto s = edge_client::load_client_state(state_path, "client-0");
        return s.ok() && s->rounds_trained == 1;
      }));
    }
    client.reset();
    client = std::make_unique<EdgeClient>(io, f.ctx(f.node, net::TlsSide::kClient), o, trainer);
    client->start();
  }
  REQUIRE(run_until(io, kWait, [&] { return agg->done() && client->stopped(); }));
  REQUIRE(agg->error().ok());
  REQUIRE(client->error().ok());
  return {agg->global().begin(), agg->global().end()};
}

TEST_CASE("a restarted client restores its error-feedback residual from the state file", "[net]") {
  Fixture f;
  const auto uninterrupted = run_with_restart(f, "", false);
  const auto path = (f.dir / "client-0.state.safetensors").string();
  const auto resumed = run_with_restart(f, path, true);
  CHECK(std::memcmp(resumed.data(), uninterrupted.data(), resumed.size() * 4) == 0);
  auto s = edge_client::load_client_state(path, "client-0");
  REQUIRE(s.ok());
  CHECK(s->rounds_trained == 3);
  CHECK(s->codec_state.count("topk:ratio=0.25,ef=1") == 1);
  // Without the state file the residual of round 1 is lost, and the model differs.
  const auto forgotten = run_with_restart(f, "", true);
  CHECK(std::memcmp(forgotten.data(), uninterrupted.data(), forgotten.size() * 4) != 0);
}

TEST_CASE("a corrupt state file stops the client with an error naming it", "[net]") {
  Fixture f;
  const auto path = (f.dir / "bad.state.safetensors").string();
  std::ofstream(path) << "not safetensors";
  asio::io_context io;
  RoundTrainer trainer(4);
  auto o = f.client_options(1);
  o.state_path = path;
  EdgeClient client(io, f.ctx(f.node, net::TlsSide::kClient), o, trainer);
  client.start();
  CHECK(client.stopped());
  CHECK(client.error().code() == StatusCode::kDataLoss);
  CHECK_THAT(client.error().message(), Catch::Contains(path));
}

TEST_CASE("a training condition keeps the client away until it allows", "[net]") {
  Fixture f;
  asio::io_context io;
  auto agg = f.aggregator(io, 2, "identity", 8);
  RoundTrainer trainer(8);
  auto o = f.client_options(agg->port());
  o.condition.file = (f.dir / "on_ac_power").string();
  EdgeClient client(io, f.ctx(f.node, net::TlsSide::kClient), o, trainer);
  client.start();
  run_until(io, milliseconds(300), [] { return false; });
  CHECK(agg->registered_clients() == 0);
  CHECK(client.connections() == 0);
  std::ofstream(o.condition.file) << "1\n";
  REQUIRE(run_until(io, kWait, [&] { return agg->done() && client.stopped(); }));
  CHECK(agg->rounds_completed() == 2);
  CHECK(client.rounds_trained() == 2);
}

TEST_CASE("a client declines rounds that would exceed its memory limit", "[net]") {
  Fixture f;
  asio::io_context io;
  auto agg = f.aggregator(io, 1, "identity", 8);
  RoundTrainer trainer(8);
  auto o = f.client_options(agg->port());
  o.memory_limit_bytes = 1 << 20;  // far below the process's resident set
  EdgeClient client(io, f.ctx(f.node, net::TlsSide::kClient), o, trainer);
  client.start();
  REQUIRE(run_until(io, kWait, [&] { return client.rounds_declined() >= 2; }));
  CHECK(trainer.trained == 0);
  CHECK(agg->rounds_completed() == 0);
}

TEST_CASE("an upload cap paces the update", "[net]") {
  Fixture f;
  asio::io_context io;
  const int64_t numel = 100'000;  // 400 kB as identity
  auto agg = f.aggregator(io, 1, "identity", numel);
  RoundTrainer trainer(numel);
  auto o = f.client_options(agg->port());
  o.chunk_bytes = 16 << 10;
  o.upload_bytes_per_second = 2'000'000;  // 0.2 s for the update at least
  EdgeClient client(io, f.ctx(f.node, net::TlsSide::kClient), o, trainer);
  client.start();
  REQUIRE(run_until(io, kWait, [&] { return trainer.trained == 1; }));
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(run_until(io, kWait, [&] { return agg->rounds_completed() == 1; }));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(seconds >= 0.9 * 400'000.0 / 2'000'000.0 - 0.02);
}

}  // namespace
}  // namespace starling::aggregator
