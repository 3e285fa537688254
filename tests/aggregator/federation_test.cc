// Aggregator and edge clients over real mutual TLS on 127.0.0.1: the global model equals the
// weighted average computed directly (exact inputs, bit for bit), drop-outs are tolerated, and
// an aggregator destroyed mid-run resumes from its state directory to the same final model.
#include <unistd.h>

#include <asio/steady_timer.hpp>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <thread>

#include "aggregator/aggregator.h"
#include "aggregator/monitor.h"
#include "core/net/chunk_stream.h"
#include "core/net/client.h"
#include "core/net/hello.h"
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

constexpr milliseconds kWait{20'000};
constexpr uint64_t kWeights[] = {1, 1, 2, 4};  // sum 8: the mean is exact

compress::Layout test_layout() { return {{"fc.weight", {3, 4}, 0}, {"fc.bias", {5}, 12}}; }
constexpr int64_t kNumel = 17;

std::vector<float> initial_model() {
  std::vector<float> g(kNumel);
  for (int64_t i = 0; i < kNumel; ++i) g[i] = static_cast<float>(i % 5 - 2);
  return g;
}

// Client k's delta in round r: small integers, so that every sum is exact in any order.
float formula_delta(int k, uint64_t round, int64_t i) {
  return static_cast<float>(
      static_cast<int64_t>((i * 7 + k * 3 + static_cast<int64_t>(round)) % 7) - 3);
}

// "Training" is a deterministic function of the client, the round and the global model.
class FormulaTrainer : public LocalTrainer {
 public:
  FormulaTrainer(int k, int fail_in_round = 0) : k_(k), fail_in_round_(fail_in_round) {}
  const compress::Layout& layout() const override { return layout_; }
  Result<TrainReport> train(std::span<const float> global, const v1::RoundPlan& plan,
                            std::span<float> delta) override {
    if (static_cast<int>(plan.round()) == fail_in_round_) return internal_error("device lost");
    seen.emplace_back(global.begin(), global.end());
    for (int64_t i = 0; i < kNumel; ++i) delta[i] = formula_delta(k_, plan.round(), i);
    return TrainReport{kWeights[k_], static_cast<float>(k_)};
  }
  std::vector<std::vector<float>> seen;

 private:
  int k_;
  int fail_in_round_;
  compress::Layout layout_ = test_layout();
};

net::TlsConfig tls_of(const TestPki& pki, const TestNode& node) {
  return net::TlsConfig{pki.ca_pem(), node.cert_pem, node.key_pem, "", true};
}

std::shared_ptr<asio::ssl::context> ctx_of(const TestPki& pki, const TestNode& node,
                                           net::TlsSide side) {
  auto ctx = net::make_tls_context(tls_of(pki, node), side);
  REQUIRE(ctx.ok());
  return *ctx;
}

struct Federation {
  explicit Federation(int n = 4) {
    for (int k = 0; k < n; ++k) {
      client_nodes.push_back(pki.issue("client-" + std::to_string(k), CertRole::kClient));
    }
  }
  TestPki pki;
  TestNode server = pki.issue("aggregator", CertRole::kServer);
  std::vector<TestNode> client_nodes;

  AggregatorOptions options(uint32_t rounds) const {
    AggregatorOptions o;
    o.num_rounds = rounds;
    o.clients_per_round = 4;
    o.min_available = 4;
    o.round_deadline = milliseconds(5000);
    o.codec = "identity";
    o.server.connection.deadlines.handshake = milliseconds(2000);
    return o;
  }

  // With `reports`: every completed round's report is appended there.
  std::unique_ptr<Aggregator> start_aggregator(asio::io_context& io, AggregatorOptions o,
                                               std::vector<RoundReport>* reports = nullptr) {
    Aggregator::RoundHook hook;
    if (reports != nullptr) {
      hook = [reports](const RoundReport& r, std::span<const float>) {
        reports->push_back(r);
        return true;
      };
    }
    auto agg = Aggregator::create(io, ctx_of(pki, server, net::TlsSide::kServer), std::move(o),
                                  test_layout(), initial_model(), std::move(hook));
    REQUIRE(agg.ok());
    return std::move(*agg);
  }

  std::unique_ptr<EdgeClient> start_client(asio::io_context& io, int k, uint16_t port,
                                           LocalTrainer& trainer,
                                           milliseconds heartbeat = milliseconds(30'000),
                                           milliseconds idle = milliseconds(120'000)) {
    EdgeClientOptions o;
    o.heartbeat_interval = heartbeat;
    o.connect.connection.deadlines.idle = idle;
    o.connect.host = "127.0.0.1";
    o.connect.port = port;
    o.connect.server_name = "localhost";
    o.node_id = "client-" + std::to_string(k);
    o.backoff.initial = milliseconds(10);
    o.backoff.max = milliseconds(100);
    o.seed = static_cast<uint64_t>(k) + 1;
    o.chunk_bytes = 16;  // several chunks per transfer
    auto c = std::make_unique<EdgeClient>(
        io, ctx_of(pki, client_nodes[static_cast<size_t>(k)], net::TlsSide::kClient), o, trainer);
    c->start();
    return c;
  }

  // Clients 0..n-1 with FormulaTrainer(k), connected to `port`.
  struct Fleet {
    std::vector<std::unique_ptr<FormulaTrainer>> trainers;
    std::vector<std::unique_ptr<EdgeClient>> clients;
  };
  Fleet start_formula_clients(asio::io_context& io, int n, uint16_t port) {
    Fleet f;
    for (int k = 0; k < n; ++k) {
      f.trainers.push_back(std::make_unique<FormulaTrainer>(k));
      f.clients.push_back(start_client(io, k, port, *f.trainers.back()));
    }
    return f;
  }
};

// The model after `rounds` rounds of FedAvg over all four clients, in double.
std::vector<float> expected_fedavg(uint64_t rounds) {
  std::vector<double> g(kNumel);
  const auto init = initial_model();
  for (int64_t i = 0; i < kNumel; ++i) g[i] = init[i];
  for (uint64_t r = 1; r <= rounds; ++r) {
    for (int64_t i = 0; i < kNumel; ++i) {
      double s = 0;
      for (int k = 0; k < 4; ++k) s += static_cast<double>(kWeights[k]) * formula_delta(k, r, i);
      g[i] += s / 8.0;
    }
  }
  return std::vector<float>(g.begin(), g.end());
}

// A serialized update of kNumel copies of `value` (one dense f32 segment), with a NaN at
// `nan_at` when it is a valid index.
std::string dense_update(float value, int64_t nan_at = -1) {
  compress::EncodedUpdate u;
  u.numel = kNumel;
  compress::Segment seg;
  seg.numel = kNumel;
  seg.shape = {kNumel};
  seg.f32.assign(kNumel, value);
  if (nan_at >= 0 && nan_at < kNumel) seg.f32[nan_at] = std::numeric_limits<float>::quiet_NaN();
  u.segments.push_back(seg);
  return compress::serialize_update(u);
}

bool bit_equal(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

TEST_CASE("FedAvg over mutual TLS equals the weighted average, bit for bit", "[net]") {
  Federation fed;
  asio::io_context io;
  std::vector<RoundReport> reports;
  auto agg = fed.start_aggregator(io, fed.options(3), &reports);
  std::vector<std::unique_ptr<FormulaTrainer>> trainers;
  std::vector<std::unique_ptr<EdgeClient>> clients;
  for (int k = 0; k < 4; ++k) {
    trainers.push_back(std::make_unique<FormulaTrainer>(k));
    clients.push_back(fed.start_client(io, k, agg->port(), *trainers.back()));
  }
  REQUIRE(run_until(io, kWait, [&] {
    return agg->done() &&
           std::all_of(clients.begin(), clients.end(), [](const auto& c) { return c->finished(); });
  }));
  CHECK(agg->error().ok());
  CHECK(agg->rounds_completed() == 3);
  REQUIRE(reports.size() == 3);
  for (const auto& r : reports) {  // the server's rates are measured, not left at zero
    CHECK(r.fold_seconds > 0.0);
    CHECK(r.fold_gbps > 0.0);
    CHECK(r.receive_gbps > 0.0);
  }
  const auto expected = expected_fedavg(3);
  CHECK(bit_equal(agg->global(), expected));
  for (int k = 0; k < 4; ++k) {
    CHECK(clients[static_cast<size_t>(k)]->rounds_trained() == 3);
    // Round timing: every acknowledged round counted, training a part of the round's time.
    const auto t = clients[static_cast<size_t>(k)]->round_times();
    CHECK(t.rounds == 3);
    CHECK(t.total_seconds > 0.0);
    CHECK(t.train_seconds >= 0.0);
    CHECK(t.train_seconds <= t.total_seconds);
    // Each client saw the global model of the round before.
    REQUIRE(trainers[static_cast<size_t>(k)]->seen.size() == 3);
    CHECK(bit_equal(trainers[static_cast<size_t>(k)]->seen[2], expected_fedavg(2)));
  }
}

// A trainer that encodes its own update (LocalTrainer::make_encoder, what a GPU trainer does with
// the GPU codecs): the formula's delta kept inside, encoded by a host codec of the client's spec
// and seed.
class EncodingTrainer final : public LocalTrainer {
 public:
  explicit EncodingTrainer(int k) : k_(k) {}
  const compress::Layout& layout() const override { return layout_; }
  Result<TrainReport> train(std::span<const float>, const v1::RoundPlan& plan,
                            std::span<float> delta) override {
    if (!delta.empty()) ++host_deltas;
    last_.resize(kNumel);
    for (int64_t i = 0; i < kNumel; ++i) last_[i] = formula_delta(k_, plan.round(), i);
    std::copy(last_.begin(), last_.begin() + static_cast<int64_t>(delta.size()), delta.begin());
    return TrainReport{kWeights[k_], static_cast<float>(k_)};
  }
  Result<std::unique_ptr<edge_client::UpdateEncoder>> make_encoder(const std::string& spec,
                                                                   uint64_t seed) override {
    ASSIGN_OR_RETURN(auto codec, compress::make_codec(spec, layout_, seed));
    ++encoders_made;
    return std::unique_ptr<edge_client::UpdateEncoder>(
        std::make_unique<Encoder>(std::move(codec), &last_));
  }
  int host_deltas = 0;
  int encoders_made = 0;

 private:
  class Encoder final : public edge_client::UpdateEncoder {
   public:
    Encoder(std::unique_ptr<compress::Codec> codec, const std::vector<float>* last)
        : codec_(std::move(codec)), last_(last) {}
    Status encode_into(compress::EncodedUpdate& out) override {
      return codec_->encode_into(*last_, out);
    }
    std::vector<float> persistent_state() override {
      const auto s = codec_->persistent_state();
      return {s.begin(), s.end()};
    }
    Status restore_state(std::span<const float> state) override {
      return codec_->restore_state(state);
    }

   private:
    std::unique_ptr<compress::Codec> codec_;
    const std::vector<float>* last_;
  };
  int k_;
  std::vector<float> last_;
  compress::Layout layout_ = test_layout();
};

TEST_CASE("a trainer that encodes its own update gives the host encoding's model, bit for bit",
          "[net]") {
  // A lossy codec with error feedback: the residual carries from round to round, on the host or
  // in the trainer's encoder alike.
  const auto run = [](bool own) {
    Federation fed;
    asio::io_context io;
    auto o = fed.options(3);
    o.codec = "topk:ratio=0.3,ef=1";
    auto agg = fed.start_aggregator(io, o);
    std::vector<std::unique_ptr<LocalTrainer>> trainers;
    std::vector<std::unique_ptr<EdgeClient>> clients;
    for (int k = 0; k < 4; ++k) {
      if (own) {
        trainers.push_back(std::make_unique<EncodingTrainer>(k));
      } else {
        trainers.push_back(std::make_unique<FormulaTrainer>(k));
      }
      clients.push_back(fed.start_client(io, k, agg->port(), *trainers.back()));
    }
    REQUIRE(run_until(io, kWait, [&] {
      return agg->done() && std::all_of(clients.begin(), clients.end(),
                                        [](const auto& c) { return c->finished(); });
    }));
    CHECK(agg->error().ok());
    CHECK(agg->rounds_completed() == 3);
    if (own) {
      for (const auto& t : trainers) {
        const auto& e = static_cast<const EncodingTrainer&>(*t);
        CHECK(e.encoders_made == 1);  // one per spec, kept across rounds
        CHECK(e.host_deltas == 0);    // trained without a host delta
      }
    }
    return std::vector<float>(agg->global().begin(), agg->global().end());
  };
  const auto host = run(false), own = run(true);
  CHECK(bit_equal(host, own));
  CHECK_FALSE(bit_equal(host, expected_fedavg(3)));  // top-k is lossy: the codec really ran
}

TEST_CASE("uploads and downloads taking turns one at a time still average bit for bit", "[net]") {
  Federation fed;
  asio::io_context io;
  auto o = fed.options(2);
  o.upload_concurrency = 1;
  o.background_hash_bytes = 0;  // every upload hashes on its helper thread, in place
  o.download_memory_bytes = o.download_window_bytes;  // one download at a time
  std::vector<RoundReport> reports;
  auto agg = fed.start_aggregator(io, o, &reports);
  std::vector<std::unique_ptr<FormulaTrainer>> trainers;
  std::vector<std::unique_ptr<EdgeClient>> clients;
  for (int k = 0; k < 4; ++k) {
    trainers.push_back(std::make_unique<FormulaTrainer>(k));
    clients.push_back(fed.start_client(io, k, agg->port(), *trainers.back()));
  }
  REQUIRE(run_until(io, kWait, [&] {
    return agg->done() &&
           std::all_of(clients.begin(), clients.end(), [](const auto& c) { return c->finished(); });
  }));
  CHECK(agg->error().ok());
  CHECK(bit_equal(agg->global(), expected_fedavg(2)));
  REQUIRE(reports.size() == 2);
  for (const auto& r : reports) {
    CHECK(r.updates == 4);
    CHECK(r.most_uploads_streaming == 1);
  }
}

TEST_CASE("heartbeats keep a waiting client and its aggregator past their idle deadlines",
          "[net]") {
  Federation fed;
  asio::io_context io;
  auto o = fed.options(1);
  // Client 0 waits 1.5 s for the other three, both ends quiet but for their heartbeats. With
  // none from one side, the other drops the connection after 400 ms and the client has to
  // reconnect.
  const std::string heartbeats = GENERATE(as<std::string>{}, "both", "client only", "server only");
  INFO("heartbeats: " << heartbeats);
  o.server.connection.deadlines.idle = milliseconds(400);
  o.heartbeat_interval = heartbeats == "client only" ? milliseconds(0) : milliseconds(100);
  auto agg = fed.start_aggregator(io, o);
  std::vector<std::unique_ptr<FormulaTrainer>> trainers;
  for (int k = 0; k < 4; ++k) trainers.push_back(std::make_unique<FormulaTrainer>(k));
  std::vector<std::unique_ptr<EdgeClient>> clients;
  clients.push_back(fed.start_client(
      io, 0, agg->port(), *trainers[0],
      heartbeats == "server only" ? milliseconds(0) : milliseconds(100), milliseconds(400)));
  io.run_for(milliseconds(1500));
  for (int k = 1; k < 4; ++k) {
    clients.push_back(fed.start_client(io, k, agg->port(), *trainers[static_cast<size_t>(k)]));
  }
  REQUIRE(run_until(io, kWait, [&] {
    return agg->done() &&
           std::all_of(clients.begin(), clients.end(), [](const auto& c) { return c->finished(); });
  }));
  CHECK(agg->error().ok());
  CHECK(bit_equal(agg->global(), expected_fedavg(1)));
  if (heartbeats == "both") {
    CHECK(clients[0]->connections() == 1);
  } else {
    CHECK(clients[0]->connections() > 1);
  }
}

// Trains as FormulaTrainer after blocking its thread (the client's I/O thread, and here every
// client's and the aggregator's) for `sleep`.
class SlowTrainer : public FormulaTrainer {
 public:
  SlowTrainer(int k, milliseconds sleep) : FormulaTrainer(k), sleep_(sleep) {}
  Result<TrainReport> train(std::span<const float> global, const v1::RoundPlan& plan,
                            std::span<float> delta) override {
    std::this_thread::sleep_for(sleep_);
    return FormulaTrainer::train(global, plan, delta);
  }

 private:
  milliseconds sleep_;
};

TEST_CASE("a round that trains longer than the idle deadlines keeps its connections", "[net]") {
  Federation fed;
  asio::io_context io;
  auto o = fed.options(1);
  o.server.connection.deadlines.idle = milliseconds(400);
  auto agg = fed.start_aggregator(io, o);
  std::vector<std::unique_ptr<SlowTrainer>> trainers;
  std::vector<std::unique_ptr<EdgeClient>> clients;
  for (int k = 0; k < 4; ++k) {
    trainers.push_back(std::make_unique<SlowTrainer>(k, milliseconds(700)));
    clients.push_back(fed.start_client(io, k, agg->port(), *trainers.back(), milliseconds(30'000),
                                       milliseconds(400)));
  }
  REQUIRE(run_until(io, kWait, [&] {
    return agg->done() &&
           std::all_of(clients.begin(), clients.end(), [](const auto& c) { return c->finished(); });
  }));
  CHECK(agg->error().ok());
  CHECK(bit_equal(agg->global(), expected_fedavg(1)));
  for (const auto& c : clients) CHECK(c->connections() == 1);
}

// Resident bytes of this process now (/proc/self/statm).
uint64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

TEST_CASE("the aggregator holds the model once, beside its sum", "[net]") {
  // The download payload is the model's own buffer, the step is made in the sum, and the
  // initial model is let go once copied: two model-sized buffers, not three or four.
  constexpr int64_t n = int64_t{16} << 20;  // 64 MiB of float32
  constexpr uint64_t model_bytes = uint64_t{n} * 4;
  Federation fed;
  asio::io_context io;
  const uint64_t before = resident_bytes();
  auto agg = Aggregator::create(io, ctx_of(fed.pki, fed.server, net::TlsSide::kServer),
                                fed.options(1), compress::flat_layout(n),
                                std::vector<float>(static_cast<size_t>(n), 0.25f));
  REQUIRE(agg.ok());
  const uint64_t grew = resident_bytes() - before;
  INFO("resident memory grew by " << (grew >> 20) << " MiB for a 64 MiB model");
  CHECK(grew >= 2 * model_bytes - (1u << 20));
#if !defined(__SANITIZE_ADDRESS__)  // ASan keeps freed memory resident in its quarantine
  CHECK(grew <= 2 * model_bytes + (16u << 20));
#endif
  CHECK((*agg)->global()[static_cast<size_t>(n) - 1] == 0.25f);
}

TEST_CASE("a client that fails mid-round is tolerated", "[net]") {
  Federation fed;
  asio::io_context io;
  auto o = fed.options(3);
  o.clients_per_round = 3;
  o.min_available = 3;
  o.min_updates = 2;
  o.round_deadline = milliseconds(3000);
  o.over_selection = 0.5;  // all four selected, so client-3 is in round 2
  auto agg = fed.start_aggregator(io, o);
  std::vector<std::unique_ptr<FormulaTrainer>> trainers;
  std::vector<std::unique_ptr<EdgeClient>> clients;
  for (int k = 0; k < 4; ++k) {
    trainers.push_back(std::make_unique<FormulaTrainer>(k, k == 3 ? 2 : 0));
    clients.push_back(fed.start_client(io, k, agg->port(), *trainers.back()));
  }
  REQUIRE(run_until(io, kWait, [&] { return agg->done(); }));
  CHECK(agg->error().ok());
  CHECK(agg->rounds_completed() == 3);
  CHECK_FALSE(clients[3]->error().ok());
  for (const auto& g : agg->global()) CHECK(std::isfinite(g));
}

TEST_CASE("over-selection closes a round with the first updates", "[net]") {
  Federation fed;
  asio::io_context io;
  auto o = fed.options(2);
  o.clients_per_round = 2;
  o.over_selection = 1.0;  // 4 selected, 2 awaited
  std::vector<RoundReport> reports;
  auto agg = fed.start_aggregator(io, o, &reports);
  std::vector<std::unique_ptr<FormulaTrainer>> trainers;
  std::vector<std::unique_ptr<EdgeClient>> clients;
  for (int k = 0; k < 4; ++k) {
    trainers.push_back(std::make_unique<FormulaTrainer>(k));
    clients.push_back(fed.start_client(io, k, agg->port(), *trainers.back()));
  }
  REQUIRE(run_until(io, kWait, [&] { return agg->done(); }));
  REQUIRE(reports.size() == 2);
  for (const auto& r : reports) {
    CHECK(r.selected == 4);
    CHECK(r.updates == 2);
  }
}

TEST_CASE("an aggregator destroyed mid-run resumes to the uninterrupted result", "[net]") {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("starling_resume_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  Federation fed;
  auto options = [&](const std::string& state_dir) {
    auto o = fed.options(6);
    o.strategy.kind = StrategyKind::kFedAvgM;
    o.strategy.momentum = 0.5f;  // dyadic: exact in any order
    o.state_dir = state_dir;
    return o;
  };

  std::vector<float> reference;
  {
    asio::io_context io;
    auto agg = fed.start_aggregator(io, options(""));
    const auto fleet = fed.start_formula_clients(io, 4, agg->port());
    REQUIRE(run_until(io, kWait, [&] { return agg->done(); }));
    reference.assign(agg->global().begin(), agg->global().end());
  }

  asio::io_context io;
  auto agg = fed.start_aggregator(io, options(dir.string()));
  const uint16_t port = agg->port();
  std::vector<std::unique_ptr<FormulaTrainer>> trainers;
  std::vector<std::unique_ptr<EdgeClient>> clients;
  for (int k = 0; k < 4; ++k) {
    trainers.push_back(std::make_unique<FormulaTrainer>(k));
    clients.push_back(fed.start_client(io, k, port, *trainers.back()));
  }
  // Crash in round 4, after some of its updates were folded.
  REQUIRE(run_until(io, kWait,
                    [&] { return agg->rounds_completed() == 3 && agg->round_updates() >= 2; }));
  const uint64_t before = agg->rounds_completed();
  agg.reset();

  auto o = options(dir.string());
  o.server.port = port;
  agg = fed.start_aggregator(io, o);
  CHECK(agg->rounds_completed() == before);  // no completed round lost
  REQUIRE(run_until(io, kWait, [&] {
    return agg->done() &&
           std::all_of(clients.begin(), clients.end(), [](const auto& c) { return c->finished(); });
  }));
  CHECK(agg->rounds_completed() == 6);
  CHECK(bit_equal(agg->global(), reference));
  for (const auto& c : clients) CHECK(c->connections() >= 2);  // they reconnected
  fs::remove_all(dir);
}

}  // namespace
}  // namespace starling::aggregator

namespace starling::aggregator {
namespace {

// A hand-driven client: says Hello with `claimed_id`, and when a model arrives answers with
// `payload` as its update.
struct RawClient {
  RawClient(asio::io_context& io, Federation& fed, int k, uint16_t port, std::string claimed_id,
            std::string update_bytes, bool stall_upload = false,
            std::function<bool()> upload_gate = {})
      : payload(std::move(update_bytes)),
        stall(stall_upload),
        gate(std::move(upload_gate)),
        poll(io) {
    net::ClientOptions o;
    o.host = "127.0.0.1";
    o.port = port;
    o.server_name = "localhost";
    net::connect(io,
                 ctx_of(fed.pki, fed.client_nodes[static_cast<size_t>(k)], net::TlsSide::kClient),
                 o, [this, claimed_id](Result<std::shared_ptr<net::Connection>> r) {
                   REQUIRE(r.ok());
                   conn = *r;
                   conn->start([this](v1::Envelope e) { on_message(std::move(e)); },
                               [this](const Status&) { closed = true; });
                   v1::Envelope hello;
                   *hello.mutable_hello() =
                       net::make_hello(claimed_id, v1::ROLE_CLIENT, {"identity"}, 1u << 20);
                   (void)conn->send(hello);
                 });
  }

  void on_message(v1::Envelope e) {
    if (e.has_round_plan()) plan = e.round_plan();
    if (e.has_error()) errors.push_back(e.error().message());
    if (e.has_chunk_ack() && e.chunk_ack().next_index() == 0) granted = true;
    if (!e.has_chunk() || sent) return;
    sent = true;  // answer the first chunk of the model; the rest is ignored
    upload_when_open();
  }

  // Uploads once `gate` allows (polled), then streams every chunk at once, without waiting for
  // the grant, or, when `stall`, announces the upload and never sends a chunk.
  void upload_when_open() {
    if (gate && !gate()) {
      poll.expires_after(milliseconds(5));
      poll.async_wait([this](const asio::error_code& ec) {
        if (!ec) upload_when_open();
      });
      return;
    }
    net::ChunkSender sender(99, payload, 64);
    v1::Envelope up;
    auto* u = up.mutable_update_upload();
    u->set_round(plan.round());
    u->set_base_version(plan.model_version());
    u->set_num_samples(1);
    *u->mutable_transfer() = sender.header();
    (void)conn->send(up);
    for (uint64_t i = 0; i < sender.num_chunks() && !stall; ++i) {
      v1::Envelope c;
      *c.mutable_chunk() = *sender.chunk(i);
      (void)conn->send(c);
    }
  }

  std::string payload;
  bool stall;
  std::function<bool()> gate;
  asio::steady_timer poll;
  std::shared_ptr<net::Connection> conn;
  v1::RoundPlan plan;
  bool sent = false;
  bool granted = false;  // the aggregator granted the upload its turn
  bool closed = false;
  std::vector<std::string> errors;
};

TEST_CASE("non-finite and malformed updates are rejected, never folded", "[net]") {
  Federation fed;
  asio::io_context io;
  auto o = fed.options(1);
  o.clients_per_round = 3;
  o.min_available = 3;
  std::vector<RoundReport> reports;
  auto agg = fed.start_aggregator(io, o, &reports);
  RawClient nan_client(io, fed, 1, agg->port(), "client-1", dense_update(1.0f, /*nan_at=*/3));
  RawClient junk_client(io, fed, 2, agg->port(), "client-2", std::string(100, '\xff'));
  FormulaTrainer honest(0);
  auto good = fed.start_client(io, 0, agg->port(), honest);

  REQUIRE(
      run_until(io, kWait, [&] { return agg->done() && nan_client.closed && junk_client.closed; }));
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].updates == 1);
  CHECK(reports[0].rejected == 2);
  REQUIRE_FALSE(nan_client.errors.empty());
  CHECK_THAT(nan_client.errors[0], Catch::Contains("non-finite"));
  // Only the honest update (client 0, weight 1) was folded.
  const auto init = initial_model();
  for (int64_t i = 0; i < kNumel; ++i) CHECK(agg->global()[i] == init[i] + formula_delta(0, 1, i));
}

TEST_CASE("a client claiming another identity is refused", "[net]") {
  Federation fed;
  asio::io_context io;
  auto agg = fed.start_aggregator(io, fed.options(1));
  RawClient impostor(io, fed, 1, agg->port(), "client-0", "");
  REQUIRE(run_until(io, kWait, [&] { return impostor.closed; }));
  CHECK(agg->registered_clients() == 0);
  REQUIRE_FALSE(impostor.errors.empty());
  CHECK_THAT(impostor.errors[0], Catch::Contains("certificate names 'client-1'"));
}

TEST_CASE("a chunk before the Hello is refused and the connection closed", "[net]") {
  Federation fed;
  asio::io_context io;
  auto agg = fed.start_aggregator(io, fed.options(1));
  std::shared_ptr<net::Connection> conn;
  std::vector<std::string> errors;
  bool closed = false;
  net::ClientOptions o;
  o.host = "127.0.0.1";
  o.port = agg->port();
  o.server_name = "localhost";
  net::connect(io, ctx_of(fed.pki, fed.client_nodes[0], net::TlsSide::kClient), o,
               [&](Result<std::shared_ptr<net::Connection>> r) {
                 REQUIRE(r.ok());
                 conn = *r;
                 conn->start(
                     [&](v1::Envelope e) {
                       if (e.has_error()) errors.push_back(e.error().message());
                     },
                     [&](const Status&) { closed = true; });
                 // Chunks go to the aggregator's chunk handler, not its message handler.
                 net::ChunkSender sender(1, "early bytes", 4);
                 auto chunk = sender.chunk_view(0);
                 REQUIRE(chunk.ok());
                 REQUIRE(conn->send_chunk(*chunk).ok());
               });
  REQUIRE(run_until(io, kWait, [&] { return closed; }));
  CHECK(agg->registered_clients() == 0);
  REQUIRE_FALSE(errors.empty());
  CHECK_THAT(errors[0], Catch::Contains("expected Hello"));
}

TEST_CASE("a stalled upload loses its turn and chunks sent before the turn are refused", "[net]") {
  Federation fed;
  asio::io_context io;
  auto o = fed.options(1);
  o.clients_per_round = 3;
  o.min_available = 3;
  o.round_deadline = milliseconds(15'000);  // only the stall timeout can end the round early
  o.upload_concurrency = 1;
  o.upload_stall_timeout = milliseconds(300);
  std::vector<RoundReport> reports;
  auto agg = fed.start_aggregator(io, o, &reports);
  const std::string valid = dense_update(1.0f);
  // Client 1 takes the only turn and never sends a chunk; client 2 uploads only once client 1
  // holds the turn, and streams its (valid) chunks without waiting for its own grant.
  RawClient staller(io, fed, 1, agg->port(), "client-1", valid, /*stall_upload=*/true);
  RawClient eager(io, fed, 2, agg->port(), "client-2", valid, false,
                  [&] { return staller.granted; });
  FormulaTrainer honest(0);
  auto good = fed.start_client(io, 0, agg->port(), honest);

  REQUIRE(run_until(
      io, kWait, [&] { return agg->done() && !staller.errors.empty() && !eager.errors.empty(); }));
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].updates == 1);
  CHECK(reports[0].rejected == 2);
  CHECK(reports[0].seconds < 10.0);  // ended by the stall timeout, not the 15 s deadline
  CHECK(reports[0].most_uploads_streaming == 1);
  REQUIRE_FALSE(staller.errors.empty());
  CHECK_THAT(staller.errors[0], Catch::Contains("no chunk for"));
  REQUIRE_FALSE(eager.errors.empty());
  CHECK_THAT(eager.errors[0], Catch::Contains("before the upload was granted its turn"));
  // Only the honest update was folded.
  const auto init = initial_model();
  for (int64_t i = 0; i < kNumel; ++i) CHECK(agg->global()[i] == init[i] + formula_delta(0, 1, i));
}

}  // namespace
}  // namespace starling::aggregator

namespace starling::aggregator {
namespace {

// Every client sends the same delta (all kConstDelta) with 3 examples: FedBuff ignores the
// examples, so each server step moves every coordinate by
// server_lr * sum_k s(staleness_k) * kConstDelta / K.
constexpr float kConstDelta = 0.5f;
class ConstTrainer : public LocalTrainer {
 public:
  const compress::Layout& layout() const override { return layout_; }
  Result<TrainReport> train(std::span<const float>, const v1::RoundPlan&,
                            std::span<float> delta) override {
    for (auto& d : delta) d = kConstDelta;
    return TrainReport{3, 0.0f};
  }

 private:
  compress::Layout layout_ = test_layout();
};

TEST_CASE("FedBuff steps by the staleness-weighted sum over K", "[net][fedbuff]") {
  CHECK(fedbuff_staleness_weight(0) == 1.0f);
  CHECK(fedbuff_staleness_weight(3) == 0.5f);
  CHECK(fedbuff_staleness_weight(8) == Approx(1.0 / 3.0).epsilon(1e-7));
  for (const uint32_t k : {1u, 2u}) {
    DYNAMIC_SECTION("K = " << k) {
      Federation fed(k + 1);
      asio::io_context io;
      auto o = fed.options(8);
      o.buffer_size = k;
      o.clients_per_round = k + 1;  // one more trains than a buffer holds: some arrive stale
      o.min_available = k + 1;      // all train from the first dispatch on
      o.strategy.server_lr = 0.5f;
      std::vector<RoundReport> reports;
      std::vector<std::vector<float>> models = {initial_model()};
      auto agg = Aggregator::create(io, ctx_of(fed.pki, fed.server, net::TlsSide::kServer), o,
                                    test_layout(), initial_model(),
                                    [&](const RoundReport& r, std::span<const float> g) {
                                      reports.push_back(r);
                                      models.emplace_back(g.begin(), g.end());
                                      return true;
                                    });
      REQUIRE(agg.ok());
      std::vector<std::unique_ptr<ConstTrainer>> trainers;
      std::vector<std::unique_ptr<EdgeClient>> clients;
      for (uint32_t c = 0; c <= k; ++c) {
        trainers.push_back(std::make_unique<ConstTrainer>());
        clients.push_back(
            fed.start_client(io, static_cast<int>(c), (*agg)->port(), *trainers.back()));
      }
      REQUIRE(run_until(io, kWait, [&] { return (*agg)->done(); }));
      CHECK((*agg)->error().ok());
      REQUIRE(reports.size() == 8);
      int stale_rounds = 0;
      for (size_t r = 0; r < reports.size(); ++r) {
        const RoundReport& rep = reports[r];
        REQUIRE(rep.updates == static_cast<int>(k));
        // The staleness of each update in the buffer, from the report's mean and max.
        const auto total = static_cast<uint64_t>(std::llround(rep.mean_staleness * k));
        std::vector<uint64_t> tau = {rep.max_staleness};
        if (k == 2) tau.push_back(total - rep.max_staleness);
        double weight_sum = 0;
        for (uint64_t t : tau) weight_sum += fedbuff_staleness_weight(t);
        const double step = 0.5 * weight_sum * kConstDelta / k;
        if (rep.max_staleness > 0) ++stale_rounds;
        INFO("round " << r + 1 << ", max staleness " << rep.max_staleness << ", mean "
                      << rep.mean_staleness);
        CHECK(rep.total_weight == Approx(weight_sum).epsilon(1e-6));
        for (int64_t i = 0; i < kNumel; ++i) {
          CHECK(models[r + 1][i] - models[r][i] == Approx(step).epsilon(1e-5));
        }
      }
      // Updates arrived stale, and those steps were damped: normalizing by the sum of the
      // weights (or weighting by examples) would have moved by 0.5 * kConstDelta every time.
      CHECK(stale_rounds > 0);
    }
  }
}

TEST_CASE("FedBuff steps the model every buffer_size updates", "[net]") {
  Federation fed;
  asio::io_context io;
  auto o = fed.options(4);
  o.buffer_size = 2;
  o.clients_per_round = 3;  // three train at any time
  std::vector<RoundReport> reports;
  auto agg = fed.start_aggregator(io, o, &reports);
  std::vector<std::unique_ptr<FormulaTrainer>> trainers;
  std::vector<std::unique_ptr<EdgeClient>> clients;
  for (int k = 0; k < 4; ++k) {
    trainers.push_back(std::make_unique<FormulaTrainer>(k));
    clients.push_back(fed.start_client(io, k, agg->port(), *trainers.back()));
  }
  REQUIRE(run_until(io, kWait, [&] { return agg->done(); }));
  CHECK(agg->error().ok());
  REQUIRE(reports.size() == 4);
  for (const auto& r : reports) {
    CHECK(r.updates == 2);
    CHECK(r.rejected == 0);
  }
  int trained = 0;
  for (const auto& c : clients) trained += c->rounds_trained();
  CHECK(trained >= 8);
  for (float g : agg->global()) CHECK(std::isfinite(g));
}

}  // namespace
}  // namespace starling::aggregator

namespace starling::aggregator {
namespace {

// Sends the same huge delta every round: a Byzantine client.
class ByzantineTrainer : public LocalTrainer {
 public:
  const compress::Layout& layout() const override { return layout_; }
  Result<TrainReport> train(std::span<const float>, const v1::RoundPlan&,
                            std::span<float> delta) override {
    for (auto& d : delta) d = 1000.0f;
    return TrainReport{100, 0.0f};
  }

 private:
  compress::Layout layout_ = test_layout();
};

TEST_CASE("Multi-Krum over TLS leaves the Byzantine client out", "[net][krum]") {
  Federation fed(5);
  asio::io_context io;
  auto o = fed.options(2);
  o.clients_per_round = 5;
  o.min_available = 5;
  o.rule.rule = RobustRule::kMultiKrum;
  o.rule.byzantine_f = 1;  // n = 5 = 2f + 3; m = n - f = 4
  std::vector<RoundReport> reports;
  auto agg = fed.start_aggregator(io, o, &reports);
  std::vector<std::unique_ptr<LocalTrainer>> trainers;
  std::vector<std::unique_ptr<EdgeClient>> clients;
  for (int k = 0; k < 5; ++k) {
    if (k < 4) {
      trainers.push_back(std::make_unique<FormulaTrainer>(k));
    } else {
      trainers.push_back(std::make_unique<ByzantineTrainer>());
    }
    clients.push_back(fed.start_client(io, k, agg->port(), *trainers.back()));
  }
  REQUIRE(run_until(io, kWait, [&] { return agg->done(); }));
  CHECK(agg->error().ok());
  REQUIRE(reports.size() == 2);
  for (const auto& r : reports) {
    CHECK(r.updates == 5);
    CHECK(r.excluded == 1);
  }
  // The unweighted mean of the four honest updates, exact (small integers / 4).
  const auto init = initial_model();
  for (int64_t i = 0; i < kNumel; ++i) {
    double g = init[i];
    for (uint64_t r = 1; r <= 2; ++r) {
      double s = 0;
      for (int k = 0; k < 4; ++k) s += formula_delta(k, r, i);
      g += s / 4.0;
    }
    CHECK(agg->global()[i] == static_cast<float>(g));
  }
}

// A DP federation of the four formula clients over TLS; the reports and the final model.
struct DpRun {
  std::vector<RoundReport> reports;
  std::vector<float> global;
  std::string metrics;
};

DpRun run_dp(Federation& fed, const AggregatorOptions& base) {
  asio::io_context io;  // first: the options below hold the monitor, which must go before it
  auto o = base;
  auto monitor = Monitor::start(io, "127.0.0.1", 0, "test federation");
  REQUIRE(monitor.ok());
  o.monitor = *monitor;
  DpRun run;
  auto agg = fed.start_aggregator(io, o, &run.reports);
  const auto fleet = fed.start_formula_clients(io, 4, agg->port());
  REQUIRE(run_until(io, kWait, [&] { return agg->done(); }));
  CHECK(agg->error().ok());
  run.global.assign(agg->global().begin(), agg->global().end());
  run.metrics = (*monitor)->metrics_text();
  return run;
}

AggregatorOptions dp_options(const Federation& fed) {
  auto o = fed.options(2);
  o.dp.clip_norm = 1.0;
  o.dp.noise_multiplier = 0.5;
  o.dp.delta = 1e-5;
  return o;
}

// Round r's update before noise: each delta scaled to norm at most 1, summed with weight 1,
// divided by the expected updates (4: q = 4 / 4 available).
std::vector<float> clipped_mean(uint64_t r, int* clipped) {
  std::vector<double> sum(kNumel, 0.0);
  *clipped = 0;
  for (int k = 0; k < 4; ++k) {
    double n2 = 0;
    for (int64_t i = 0; i < kNumel; ++i) n2 += formula_delta(k, r, i) * formula_delta(k, r, i);
    const double scale = n2 > 1.0 ? 1.0 / std::sqrt(n2) : 1.0;
    if (n2 > 1.0) ++*clipped;
    for (int64_t i = 0; i < kNumel; ++i) sum[i] += formula_delta(k, r, i) * scale;
  }
  std::vector<float> delta(kNumel);
  for (int64_t i = 0; i < kNumel; ++i) delta[i] = static_cast<float>(sum[i] / 4.0);
  return delta;
}

TEST_CASE("simulated central DP clips, averages over the expected updates, adds seeded noise",
          "[net][dp]") {
  Federation fed;
  auto o = dp_options(fed);
  o.simulation = true;
  o.dp.simulation_seed = 7;
  const DpRun run = run_dp(fed, o);
  REQUIRE(run.reports.size() == 2);
  // Directly: Poisson sampling at q = 1 draws all four, then N(0, (0.5 * 1 / 4)^2) from the
  // round's seeded stream.
  std::vector<float> g = initial_model();
  RdpAccountant acc;
  for (uint64_t r = 1; r <= 2; ++r) {
    int clipped = 0;
    std::vector<float> delta = clipped_mean(r, &clipped);
    auto src = NoiseSource::seeded(Rng(7).fork(r << 16).next_u64());
    auto drawn = poisson_sample(4, 1.0, src);
    REQUIRE(drawn.ok());
    REQUIRE(drawn->size() == 4);
    REQUIRE(src.add_gaussian(delta, 0.125).ok());
    for (int64_t i = 0; i < kNumel; ++i) g[i] += delta[i];
    const RoundReport& rep = run.reports[r - 1];
    CHECK(rep.clipped == clipped);
    CHECK(clipped >= 3);
    CHECK(rep.dp_noise_std == Approx(0.125));
    CHECK(rep.dp_sampling_rate == 1.0);
    CHECK(rep.dp_expected_updates == 4.0);
    acc.compose(1.0, 0.5);
    CHECK(rep.dp_epsilon == Approx(acc.spent(1e-5).epsilon).epsilon(1e-12));
  }
  CHECK(run.reports[1].dp_epsilon > run.reports[0].dp_epsilon);
  for (int64_t i = 0; i < kNumel; ++i) CHECK(run.global[i] == Approx(g[i]).margin(1e-5));
  // The same simulation again: the same model, bit for bit.
  const DpRun again = run_dp(fed, o);
  CHECK(again.global == run.global);
  // The monitor saw the rounds.
  CHECK_THAT(run.metrics, Catch::Contains("starling_rounds_completed_total 2"));
  CHECK_THAT(run.metrics, Catch::Contains("starling_updates_folded_total 8"));
  CHECK_THAT(run.metrics, Catch::Contains("starling_clients_registered 4"));
  CHECK_THAT(run.metrics, Catch::Contains("starling_dp_epsilon "));
}

TEST_CASE("real DP noise cannot be recomputed by someone who has the config and the models",
          "[net][dp]") {
  Federation fed;
  auto o = dp_options(fed);  // no simulation seed: the DRBG
  o.num_rounds = 1;
  const DpRun a = run_dp(fed, o);
  const DpRun b = run_dp(fed, o);
  REQUIRE(a.reports.size() == 1);
  REQUIRE(b.reports.size() == 1);
  // The adversary knows the config, the clients' exact updates (so the noiseless mean) and
  // the global model before and after the round; what is left is the round's noise.
  int clipped = 0;
  const std::vector<float> clean = clipped_mean(1, &clipped);
  const auto init = initial_model();
  auto noise_of = [&](const std::vector<float>& g) {
    std::vector<float> n(kNumel);
    for (int64_t i = 0; i < kNumel; ++i) n[i] = g[i] - init[i] - clean[i];
    return n;
  };
  // Same config, same clients: the noise differs between the runs.
  const std::vector<float> round1 = noise_of(a.global);
  CHECK(round1 != noise_of(b.global));
  // ...and it is none of the streams a config could name: the seeded simulation stream, or the
  // xoshiro stream the noise once came from (Rng(seed).fork(round)), for any small seed.
  double ss = 0;
  for (float x : round1) ss += static_cast<double>(x) * x;
  CHECK(ss > 0);  // there is noise to find
  for (uint64_t seed = 0; seed < 256; ++seed) {
    std::vector<float> guess(kNumel, 0.0f);
    auto src = NoiseSource::seeded(Rng(seed).fork(1ull << 16).next_u64());
    REQUIRE(poisson_sample(4, 1.0, src).ok());
    REQUIRE(src.add_gaussian(guess, 0.125).ok());
    std::vector<float> old(kNumel, 0.0f);
    Rng rng = Rng(seed).fork(1);
    for (float& x : old) x = static_cast<float>(0.125 * rng.normal());
    double miss_new = 0;
    double miss_old = 0;
    for (int64_t i = 0; i < kNumel; ++i) {
      miss_new += std::abs(static_cast<double>(guess[i]) - round1[i]);
      miss_old += std::abs(static_cast<double>(old[i]) - round1[i]);
    }
    INFO("seed " << seed);
    // A recomputed noise would match to float rounding (~1e-6 a coordinate).
    CHECK(miss_new > 1e-3);
    CHECK(miss_old > 1e-3);
  }
}

TEST_CASE("a client off the allow-list is refused with its name", "[net][access]") {
  Federation fed;
  asio::io_context io;
  auto monitor = Monitor::start(io, "127.0.0.1", 0, "test federation");
  REQUIRE(monitor.ok());
  {
    auto o = fed.options(2);
    o.clients_per_round = 3;
    o.min_available = 3;
    o.access.restricted = true;
    o.access.allowed = {"client-0", "client-1", "client-2"};
    o.monitor = *monitor;
    auto agg = fed.start_aggregator(io, o);
    const auto fleet = fed.start_formula_clients(io, 4, agg->port());
    const auto& trainers = fleet.trainers;
    REQUIRE(run_until(io, kWait, [&] { return agg->done(); }));
    CHECK(agg->error().ok());
    CHECK(trainers[3]->seen.empty());  // never trained for this federation
    for (int k = 0; k < 3; ++k) CHECK(trainers[static_cast<size_t>(k)]->seen.size() == 2);
  }
  CHECK_THAT((*monitor)->metrics_text(), Catch::Contains("starling_identities_refused_total"));
  CHECK_THAT((*monitor)->metrics_text(), !Catch::Contains("starling_identities_refused_total 0"));
  CHECK_THAT((*monitor)->status_json(), Catch::Contains("client-3 is not on the allow-list"));
  CHECK_THAT((*monitor)->status_html(), Catch::Contains("client-3 is not on the allow-list"));
}

TEST_CASE("revoking a connected client closes its session at once", "[net][access]") {
  Federation fed;
  asio::io_context io;
  auto o = fed.options(3);
  o.clients_per_round = 3;
  o.min_available = 3;
  std::vector<RoundReport> reports;
  auto agg = fed.start_aggregator(io, o, &reports);
  const auto fleet = fed.start_formula_clients(io, 4, agg->port());
  const auto& trainers = fleet.trainers;
  REQUIRE(run_until(io, kWait, [&] { return agg->registered_clients() == 4; }));
  AccessPolicy revoke3;
  revoke3.revoked = {net::cert_serial_hex(fed.client_nodes[3].cert.get())};
  agg->set_access(revoke3);
  // Closed at once, not at its next message.
  REQUIRE(run_until(io, milliseconds(1000), [&] { return agg->registered_clients() == 3; }));
  const size_t seen_at_revocation = trainers[3]->seen.size();
  REQUIRE(run_until(io, kWait, [&] { return agg->done(); }));
  CHECK(agg->error().ok());
  CHECK(reports.size() == 3);
  // It kept reconnecting and was refused each time: no round after the revocation reached it.
  CHECK(trainers[3]->seen.size() == seen_at_revocation);
  CHECK(agg->registered_clients() <= 3);
  AccessPolicy p;
  CHECK(p.refusal("x", "AB").empty());
  p.restricted = true;
  CHECK_THAT(p.refusal("x", "AB"), Catch::Contains("x is not on the allow-list"));
  p.allowed = {"x"};
  CHECK(p.refusal("x", "AB").empty());
  p.revoked = {"AB"};
  CHECK_THAT(p.refusal("x", "AB"), Catch::Contains("certificate AB of x is revoked"));
}

TEST_CASE("the aggregator refuses a DP simulation seed outside a simulation", "[net][dp]") {
  Federation fed;
  asio::io_context io;
  auto o = dp_options(fed);
  o.dp.simulation_seed = 7;
  auto agg = Aggregator::create(io, ctx_of(fed.pki, fed.server, net::TlsSide::kServer), o,
                                test_layout(), initial_model());
  REQUIRE_FALSE(agg.ok());
  CHECK_THAT(agg.status().message(),
             Catch::Contains("simulation_seed") && Catch::Contains("outside a simulation"));
}

}  // namespace
}  // namespace starling::aggregator

namespace starling::aggregator {
namespace {

TEST_CASE("uploads beyond the memory budget wait on disk and fold bit for bit", "[net]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("starling_spill_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  Federation fed;
  asio::io_context io;
  auto o = fed.options(3);
  o.upload_memory_bytes = 0;  // every upload waits on disk
  o.spill_dir = dir.string();
  o.background_hash_bytes = GENERATE(uint64_t{0}, uint64_t{4} << 20);  // helper thread, inline
  auto agg = fed.start_aggregator(io, o);
  std::vector<std::unique_ptr<FormulaTrainer>> trainers;
  std::vector<std::unique_ptr<EdgeClient>> clients;
  for (int k = 0; k < 4; ++k) {
    trainers.push_back(std::make_unique<FormulaTrainer>(k));
    clients.push_back(fed.start_client(io, k, agg->port(), *trainers.back()));
  }
  REQUIRE(run_until(io, kWait, [&] { return agg->done(); }));
  CHECK(agg->error().ok());
  CHECK(bit_equal(agg->global(), expected_fedavg(3)));
  // The uploads went to disk (the directory was made), and nothing is left there.
  REQUIRE(fs::exists(dir));
  CHECK(fs::is_empty(dir));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace starling::aggregator

namespace starling::aggregator {
namespace {

TEST_CASE("the DP accountant resumes from the checkpoint and keeps counting", "[net][dp]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("starling_dp_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  Federation fed;
  auto options = [&](uint32_t rounds) {
    auto o = fed.options(rounds);
    o.dp.clip_norm = 1.0;
    o.dp.noise_multiplier = 1.5;
    o.state_dir = dir.string();
    return o;
  };
  std::vector<RoundReport> reports;
  auto hook = [&](const RoundReport& r, std::span<const float>) {
    reports.push_back(r);
    return true;
  };
  asio::io_context io;
  std::vector<std::unique_ptr<FormulaTrainer>> trainers;
  for (int k = 0; k < 4; ++k) trainers.push_back(std::make_unique<FormulaTrainer>(k));
  for (uint32_t rounds : {2u, 3u}) {  // a second aggregator resumes after round 2
    auto agg = Aggregator::create(io, ctx_of(fed.pki, fed.server, net::TlsSide::kServer),
                                  options(rounds), test_layout(), initial_model(), hook);
    REQUIRE(agg.ok());
    std::vector<std::unique_ptr<EdgeClient>> clients;
    for (int k = 0; k < 4; ++k) {
      clients.push_back(fed.start_client(io, k, (*agg)->port(), *trainers[k]));
    }
    REQUIRE(run_until(io, kWait, [&] {
      return (*agg)->done() && std::all_of(clients.begin(), clients.end(),
                                           [](const auto& c) { return c->finished(); });
    }));
    CHECK((*agg)->error().ok());
  }
  REQUIRE(reports.size() == 3);
  RdpAccountant acc;
  acc.compose(1.0, 1.5, 3);
  CHECK(reports[2].round == 3);
  CHECK(reports[2].dp_epsilon == Approx(acc.spent(1e-5).epsilon).epsilon(1e-12));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace starling::aggregator
