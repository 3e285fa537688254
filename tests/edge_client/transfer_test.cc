// Raw f32 payloads and flat parameter vectors.
#include "edge_client/transfer.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <optional>
#include <set>

#include "edge_client/model_params.h"
#include "models/mlp/mlp.h"
#include "tests/testing/loopback.h"
#include "tests/testing/tls_fixtures.h"

namespace starling::edge_client {
namespace {

TEST_CASE("f32 payloads round-trip and refuse a wrong size", "[edge_client]") {
  const std::vector<float> v = {1.5f, -0.0f, 3e38f};
  const std::string bytes = to_f32_bytes(v);
  CHECK(bytes.size() == 12);
  std::vector<float> back(3);
  REQUIRE(from_f32_bytes(bytes, back).ok());
  CHECK(back == v);
  std::vector<float> wrong(2);
  CHECK(from_f32_bytes(bytes, wrong).code() == StatusCode::kDataLoss);
}

TEST_CASE("a module flattens to its layout and loads back", "[edge_client]") {
  models::Mlp a(models::MlpConfig{6, 4, 3}, 1);
  models::Mlp b(models::MlpConfig{6, 4, 3}, 2);
  const auto layout = layout_of(a);
  REQUIRE(layout.size() == 6);
  CHECK(layout[0].name == "fc1.weight");
  CHECK(layout[5].name == "fc3.bias");
  CHECK(compress::validate_layout(layout).value() == a.num_parameters());
  const auto flat = flatten(a);
  REQUIRE(load_flat(b, flat).ok());
  CHECK(flatten(b) == flat);
  CHECK_FALSE(load_flat(b, std::vector<float>(3)).ok());
}

TEST_CASE("pumps sharing slots take turns, and a cancelled or destroyed one gives its turn away",
          "[edge_client]") {
  testing::TestPki pki;
  const auto server_node = pki.issue("aggregator", net::CertRole::kServer);
  asio::io_context io;
  testing::LoopbackServer server(
      io, {pki.ca_pem(), server_node.cert_pem, server_node.key_pem, "", true});
  server.echo = false;
  // Four senders; the server's side of each counts what arrives.
  std::vector<std::shared_ptr<net::Connection>> conns;
  for (int k = 0; k < 4; ++k) {
    const auto node = pki.issue("client-" + std::to_string(k), net::CertRole::kClient);
    auto conn = testing::connect_client(io, {pki.ca_pem(), node.cert_pem, node.key_pem, "", true},
                                        server.port());
    REQUIRE(conn.ok());
    conns.push_back(*conn);
    conns.back()->start([](v1::Envelope) {}, [](const Status&) {});
  }
  auto payload = std::make_shared<const std::string>(std::string(300'000, 'p'));
  auto slots = std::make_shared<PumpSlots>(1);
  std::vector<std::shared_ptr<ChunkPump>> pumps;
  for (size_t k = 0; k < conns.size(); ++k) {
    pumps.push_back(
        std::make_shared<ChunkPump>(conns[k], payload, k + 1, 16 * 1024, "test", 32 * 1024));
    pumps.back()->set_slots(slots);
    pumps.back()->start();
  }
  CHECK(slots->free_slots() == 0);
  CHECK(slots->waiting() == 3);
  pumps[1]->cancel();  // waiting: it never sends, and the others do not wait for it
  pumps[2].reset();    // destroyed while waiting: likewise

  const size_t chunks = (payload->size() + 16 * 1024 - 1) / (16 * 1024);
  size_t most_sending = 0;
  auto arrived = [&](uint64_t transfer) {
    return std::count_if(server.received.begin(), server.received.end(), [&](const auto& e) {
      return e.has_chunk() && e.chunk().transfer_id() == transfer;
    });
  };
  REQUIRE(testing::run_until(io, std::chrono::seconds(20), [&] {
    size_t sending = 0;
    for (const auto& c : conns) sending += c->queued_bytes() > 0 ? 1 : 0;
    most_sending = std::max(most_sending, sending);
    return arrived(1) == static_cast<long>(chunks) && arrived(4) == static_cast<long>(chunks);
  }));
  CHECK(most_sending == 1);  // one send queue filled at a time
  CHECK(arrived(2) == 0);
  CHECK(arrived(3) == 0);
  CHECK(pumps[0]->done());
  CHECK(pumps[3]->done());
  CHECK(slots->waiting() == 0);
  CHECK(slots->free_slots() == 1);  // every turn given back
}

}  // namespace
}  // namespace starling::edge_client
