// Secure aggregation over real mutual TLS on 127.0.0.1 (docs/secagg.md): the aggregator and
// edge clients run SecAgg+'s four stages; the model moves by exactly the mean of the quantized
// updates with 0, 10% and 30% of the clients dropping after the share stage; a drop below the
// threshold aborts the round and leaves the model unchanged; forged and malformed masked vectors
// are refused naming the client, and the round completes without them; a client that requires
// secure aggregation never sends its update in the clear.
#include <asio/steady_timer.hpp>
#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <memory>

#include "aggregator/aggregator.h"
#include "core/net/chunk_stream.h"
#include "core/net/client.h"
#include "core/net/hello.h"
#include "core/secagg/protocol.h"
#include "edge_client/edge_client.h"
#include "edge_client/transfer.h"
#include "tests/testing/loopback.h"
#include "tests/testing/tls_fixtures.h"

namespace starling::aggregator {
namespace {

using edge_client::EdgeClient;
using edge_client::LocalTrainer;
using edge_client::TrainReport;
using std::chrono::milliseconds;
using testing::run_until;
using testing::TestNode;
using testing::TestPki;

constexpr milliseconds kWait{30'000};
constexpr int64_t kNumel = 23;
constexpr double kClip = 8.0;
constexpr uint32_t kLevels = 65537;  // scale (levels - 1) / (2 clip) = 4096 integers per unit

compress::Layout layout() { return {{"w", {kNumel}, 0}}; }

std::vector<float> initial_model() {
  std::vector<float> g(kNumel);
  for (int64_t i = 0; i < kNumel; ++i) g[i] = static_cast<float>(i % 3) - 1.0f;
  return g;
}

// Client k's update: multiples of 1/4096 inside the clipping range, so the quantizer sends
// them exactly and every sum is exact.
float delta_of(int k, int64_t i) {
  return static_cast<float>((k * 37 + i * 11) % 97 - 48) / 4096.0f * 16.0f;
}

// Fails its first `fail_first` calls (the client tells the aggregator and leaves the round,
// after the share stage: training begins once the keys are shared).
class StepTrainer : public LocalTrainer {
 public:
  StepTrainer(int k, int fail_first) : k_(k), fail_first_(fail_first) {}
  const compress::Layout& layout() const override { return layout_; }
  bool round_failures_recoverable() const override { return true; }
  Result<TrainReport> train(std::span<const float> global, const v1::RoundPlan&,
                            std::span<float> delta) override {
    seen.emplace_back(global.begin(), global.end());
    if (calls_++ < fail_first_) return internal_error("device lost");
    for (int64_t i = 0; i < kNumel; ++i) delta[i] = delta_of(k_, i);
    return TrainReport{static_cast<uint64_t>(k_ + 1), 1.0f};
  }
  std::vector<std::vector<float>> seen;  // the global model of every call

 private:
  int k_;
  int fail_first_;
  int calls_ = 0;
  compress::Layout layout_ = ::starling::aggregator::layout();
};

std::shared_ptr<asio::ssl::context> ctx_of(const TestPki& pki, const TestNode& node,
                                           net::TlsSide side) {
  auto ctx = net::make_tls_context(
      net::TlsConfig{pki.ca_pem(), node.cert_pem, node.key_pem, "", true}, side);
  REQUIRE(ctx.ok());
  return *ctx;
}

struct SecureFederation {
  explicit SecureFederation(int n) {
    for (int k = 0; k < n; ++k) nodes.push_back(pki.issue(name(k), net::CertRole::kClient));
  }
  static std::string name(int k) { return "client-" + std::to_string(k); }

  AggregatorOptions options(uint32_t n) const {
    AggregatorOptions o;
    o.num_rounds = 1;
    o.clients_per_round = n;
    o.min_available = n;
    o.round_deadline = milliseconds(10'000);
    o.server.connection.deadlines.handshake = milliseconds(2000);
    o.secagg.set_enabled(true);
    o.secagg.set_clip_range(static_cast<float>(kClip));
    o.secagg.set_quantization_levels(kLevels);
    o.secagg.set_modulus_bits(32);
    o.secagg.set_error_feedback(true);
    o.secagg.set_dropout_tolerance(0.3f);
    o.secagg_stage_timeout = milliseconds(5000);
    return o;
  }

  std::unique_ptr<Aggregator> start(AggregatorOptions o) {
    auto agg =
        Aggregator::create(io, ctx_of(pki, server, net::TlsSide::kServer), std::move(o), layout(),
                           initial_model(), [this](const RoundReport& r, std::span<const float>) {
                             reports.push_back(r);
                             return true;
                           });
    REQUIRE(agg.ok());
    return std::move(*agg);
  }

  std::unique_ptr<EdgeClient> client(int k, uint16_t port, LocalTrainer& trainer,
                                     bool require_secure = true) {
    edge_client::EdgeClientOptions o;
    o.connect.host = "127.0.0.1";
    o.connect.port = port;
    o.connect.server_name = "localhost";
    o.node_id = name(k);
    o.backoff.initial = milliseconds(10);
    o.backoff.max = milliseconds(100);
    o.seed = static_cast<uint64_t>(k) + 1;
    o.chunk_bytes = 32;  // several chunks per masked vector
    o.require_secure_aggregation = require_secure;
    auto c = std::make_unique<EdgeClient>(
        io, ctx_of(pki, nodes[static_cast<size_t>(k)], net::TlsSide::kClient), o, trainer);
    c->start();
    return c;
  }

  // Clients 0..n-1 on `port`, client k's trainer failing its first fail_first(k) calls.
  void start_fleet(int n, uint16_t port, const std::function<int(int)>& fail_first) {
    for (int k = 0; k < n; ++k) {
      trainers.push_back(std::make_unique<StepTrainer>(k, fail_first(k)));
      clients.push_back(client(k, port, *trainers.back()));
    }
  }

  asio::io_context io;  // first: it outlives the clients below
  TestPki pki;
  TestNode server = pki.issue("aggregator", net::CertRole::kServer);
  std::vector<TestNode> nodes;
  std::vector<RoundReport> reports;
  std::vector<std::unique_ptr<StepTrainer>> trainers;  // outlive their clients
  std::vector<std::unique_ptr<EdgeClient>> clients;
};

// The model after one round whose survivors are `clients`: the aggregator's arithmetic, in
// float (the sum of exact multiples of 1/4096 is exact; then the mean's factor and the step).
std::vector<float> expected_model(const std::vector<int>& clients) {
  auto g = initial_model();
  const auto inv = static_cast<float>(1.0 / static_cast<double>(clients.size()));
  for (int64_t i = 0; i < kNumel; ++i) {
    double sum = 0;
    for (int k : clients) sum += delta_of(k, i);
    g[i] += static_cast<float>(sum) * inv;
  }
  return g;
}

bool bit_equal(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

TEST_CASE(
    "secure aggregation over mutual TLS: the model moves by exactly the survivors' mean, with 0, "
    "10% and 30% of the clients dropping after the share stage",
    "[net][secagg]") {
  const int drops = GENERATE(0, 1, 3);
  constexpr int kClients = 10;
  SecureFederation fed(kClients);
  auto agg = fed.start(fed.options(kClients));
  fed.start_fleet(kClients, agg->port(), [&](int k) { return k < drops ? 1 : 0; });
  std::vector<int> survivors;
  for (int k = drops; k < kClients; ++k) survivors.push_back(k);
  REQUIRE(run_until(fed.io, kWait, [&] { return agg->done(); }));
  INFO("drops " << drops << ": " << agg->error().to_string());
  REQUIRE(agg->error().ok());
  REQUIRE(fed.reports.size() == 1);
  const RoundReport& r = fed.reports[0];
  CHECK(r.secagg_survivors == kClients - drops);
  CHECK(r.secagg_dropped == drops);
  CHECK(r.updates == kClients - drops);
  CHECK(r.secagg_degree == kClients - 1);  // 10 clients: every other one
  CHECK(r.secagg_threshold == 6);
  for (uint64_t b : r.secagg_stage_bytes) CHECK(b > 0);
  // Exact: integers summed mod 2^32, the masks cancelled, the dropped clients' removed.
  CHECK(bit_equal(agg->global(), expected_model(survivors)));
}

TEST_CASE(
    "secure aggregation: survivors below the threshold abort the round, the model unchanged, "
    "and the retry runs with fresh keys",
    "[net][secagg]") {
  constexpr int kClients = 10;
  SecureFederation fed(kClients);
  auto agg = fed.start(fed.options(kClients));
  fed.start_fleet(kClients, agg->port(), [](int k) { return k < 5 ? 1 : 0; });  // threshold 6
  REQUIRE(run_until(fed.io, kWait, [&] { return agg->done(); }));
  REQUIRE(agg->error().ok());
  REQUIRE(fed.reports.size() == 1);
  CHECK(fed.reports[0].secagg_survivors == kClients);
  std::vector<int> all(kClients);
  for (int k = 0; k < kClients; ++k) all[static_cast<size_t>(k)] = k;
  CHECK(bit_equal(agg->global(), expected_model(all)));
  // Every client trained twice from the initial model: the aborted attempt changed nothing.
  for (const auto& t : fed.trainers) {
    REQUIRE(t->seen.size() == 2);
    CHECK(bit_equal(t->seen[1], initial_model()));
  }
}

// A client that follows the protocol with a real ClientSession up to its masked vector, and then
// sends a forged one: `claim` another client's index, or a vector cut short.
struct ForgingClient {
  enum class Forgery { kOtherIndex, kShortVector, kSilent };
  ForgingClient(asio::io_context& io, SecureFederation& fed, int k, uint16_t port, Forgery f)
      : forgery(f) {
    net::ClientOptions o;
    o.host = "127.0.0.1";
    o.port = port;
    o.server_name = "localhost";
    net::connect(io, ctx_of(fed.pki, fed.nodes[static_cast<size_t>(k)], net::TlsSide::kClient), o,
                 [this, k](Result<std::shared_ptr<net::Connection>> r) {
                   REQUIRE(r.ok());
                   conn = *r;
                   conn->start([this](v1::Envelope e) { on_message(std::move(e)); },
                               [this](const Status&) { closed = true; });
                   v1::Envelope hello;
                   *hello.mutable_hello() = net::make_hello(
                       SecureFederation::name(k), v1::ROLE_CLIENT, {"identity"}, 1u << 20);
                   (void)conn->send(hello);
                 });
  }

  void send(const v1::SecAggMessage& m) {
    v1::Envelope e;
    *e.mutable_secagg() = m;
    (void)conn->send(e);
  }

  void on_message(v1::Envelope e) {
    if (e.has_round_plan()) plan = e.round_plan();
    if (e.has_error()) errors.push_back(e.error().message());
    if (e.has_secagg()) {
      const auto& m = e.secagg();
      v1::SecAggMessage out;
      if (m.has_setup() && forgery == Forgery::kSilent) return;  // never advertises
      if (m.has_setup()) {
        auto s = secagg::ClientSession::create(plan.round(), m.setup());
        REQUIRE(s.ok());
        session = std::move(*s);
        *out.mutable_advertise() = session->advertise();
        send(out);
      } else if (m.has_keys()) {
        auto shares = session->share_keys(m.keys());
        REQUIRE(shares.ok());
        *out.mutable_share_keys() = *shares;
        send(out);
      } else if (m.has_ciphertexts()) {
        std::vector<uint32_t> zeros(session->params().vector_length, 0);
        auto masked = session->masked_input(m.ciphertexts(), zeros);
        REQUIRE(masked.ok());
        if (forgery == Forgery::kOtherIndex) {
          masked->set_index((masked->index() + 1) % session->params().num_clients);
        } else {
          masked->mutable_packed()->resize(masked->packed().size() / 2);
        }
        upload(masked->SerializeAsString());
      }
    }
    if (e.has_chunk_ack() && e.chunk_ack().next_index() == 0 && sender) {
      for (uint64_t i = 0; i < sender->num_chunks(); ++i) {  // the turn was granted
        v1::Envelope c;
        *c.mutable_chunk() = *sender->chunk(i);
        (void)conn->send(c);
      }
    }
  }

  void upload(std::string bytes) {
    payload = std::move(bytes);
    sender.emplace(7, payload, 64, std::string(edge_client::kSecAggMaskedContentType));
    v1::Envelope up;
    auto* u = up.mutable_update_upload();
    u->set_round(plan.round());
    u->set_base_version(plan.model_version());
    u->set_num_samples(1);
    u->set_codec(std::string(edge_client::kSecAggMaskedContentType));
    *u->mutable_transfer() = sender->header();
    (void)conn->send(up);
  }

  Forgery forgery;
  std::shared_ptr<net::Connection> conn;
  v1::RoundPlan plan;
  std::unique_ptr<secagg::ClientSession> session;
  std::string payload;
  std::optional<net::ChunkSender> sender;
  bool closed = false;
  std::vector<std::string> errors;
};

TEST_CASE(
    "secure aggregation: a forged index and a short masked vector are refused naming the "
    "client, and the round completes without them",
    "[net][secagg]") {
  constexpr int kHonest = 6;
  SecureFederation fed(kHonest + 2);
  auto agg = fed.start(fed.options(kHonest + 2));
  fed.start_fleet(kHonest, agg->port(), [](int) { return 0; });
  const std::vector<int> honest = {0, 1, 2, 3, 4, 5};
  ForgingClient other(fed.io, fed, kHonest, agg->port(), ForgingClient::Forgery::kOtherIndex);
  ForgingClient shorter(fed.io, fed, kHonest + 1, agg->port(),
                        ForgingClient::Forgery::kShortVector);
  REQUIRE(run_until(fed.io, kWait, [&] { return agg->done(); }));
  REQUIRE(agg->error().ok());
  REQUIRE(fed.reports.size() == 1);
  const RoundReport& r = fed.reports[0];
  CHECK(r.secagg_survivors == kHonest);
  CHECK(r.secagg_dropped == 2);  // shared keys, no accepted vector: their masks were removed
  CHECK(r.rejected == 2);
  CHECK(bit_equal(agg->global(), expected_model(honest)));
  REQUIRE_FALSE(other.errors.empty());
  CHECK_THAT(other.errors[0], Catch::Contains("client-6") && Catch::Contains("claims to be"));
  REQUIRE_FALSE(shorter.errors.empty());
  CHECK_THAT(shorter.errors[0], Catch::Contains("client-7"));
}

TEST_CASE("secure aggregation: a client silent in the key stage is left out at the stage timeout",
          "[net][secagg]") {
  SecureFederation fed(5);
  auto o = fed.options(5);
  o.secagg_stage_timeout = milliseconds(300);
  auto agg = fed.start(o);
  fed.start_fleet(4, agg->port(), [](int) { return 0; });
  ForgingClient silent(fed.io, fed, 4, agg->port(), ForgingClient::Forgery::kSilent);
  REQUIRE(run_until(fed.io, kWait, [&] { return agg->done(); }));
  REQUIRE(agg->error().ok());
  REQUIRE(fed.reports.size() == 1);
  CHECK(fed.reports[0].secagg_survivors == 4);
  CHECK(fed.reports[0].secagg_dropped == 0);  // it never shared keys: not in the graph's U1
  CHECK(fed.reports[0].seconds < 5.0);        // the stage timeout, not the round deadline
  CHECK(bit_equal(agg->global(), expected_model({0, 1, 2, 3})));
}

TEST_CASE("a client that requires secure aggregation refuses a round in the clear",
          "[net][secagg]") {
  SecureFederation fed(1);
  auto o = fed.options(1);
  o.secagg.set_enabled(false);
  o.round_deadline = milliseconds(2000);
  auto agg = fed.start(o);
  StepTrainer trainer(0, 0);
  auto client = fed.client(0, agg->port(), trainer, /*require_secure=*/true);
  REQUIRE(run_until(fed.io, kWait, [&] { return client->stopped(); }));
  CHECK(trainer.seen.empty());  // it never trained, so nothing could leave
  CHECK(client->error().code() == StatusCode::kPermissionDenied);
  CHECK_THAT(client->error().message(), Catch::Contains("[secagg]"));
  CHECK(agg->rounds_completed() == 0);
}

}  // namespace
}  // namespace starling::aggregator
