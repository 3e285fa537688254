// Chunked transfers: larger than the frame limit, corrupt chunks detected and re-requested,
// resumption from the last acknowledged chunk, untrusted headers validated.
#include "core/net/chunk_stream.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <optional>
#include <vector>

#include "core/net/client.h"
#include "core/util/rng.h"
#include "core/wire/crc32c.h"
#include "tests/testing/loopback.h"
#include "tests/testing/tls_fixtures.h"

namespace starling::net {
namespace {

std::string random_payload(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng.next_u64());
  return s;
}

TEST_CASE("a transfer larger than the frame limit arrives intact over TLS", "[net]") {
  constexpr uint32_t kFrameLimit = 1 << 20;
  const std::string payload = random_payload(5'000'000 + 17, 3);
  testing::TestPki pki;
  const auto server_node = pki.issue("aggregator", CertRole::kServer);
  const auto client_node = pki.issue("client-1", CertRole::kClient);
  asio::io_context io;
  ServerOptions so;
  so.connection.max_frame_bytes = kFrameLimit;
  testing::LoopbackServer server(
      io, {pki.ca_pem(), server_node.cert_pem, server_node.key_pem, "", true}, so);
  server.echo = false;

  ClientOptions co;
  co.connection.max_frame_bytes = kFrameLimit;
  auto conn = testing::connect_client(
      io, {pki.ca_pem(), client_node.cert_pem, client_node.key_pem, "", true}, server.port(), co);
  REQUIRE(conn.ok());
  auto c = *conn;
  c->start([](v1::Envelope) {}, [](const Status&) {});

  ChunkSender sender(42, payload, 256 * 1024, "test/bytes");
  v1::Envelope whole;
  whole.mutable_chunk()->set_data(payload);
  CHECK(c->send(whole).code() == StatusCode::kInvalidArgument);  // one frame cannot hold it

  v1::Envelope head;
  head.set_seq(1);
  *head.mutable_update_upload()->mutable_transfer() = sender.header();
  REQUIRE(c->send(head).ok());
  for (uint64_t i = 0; i < sender.num_chunks(); ++i) {
    v1::Envelope e;
    e.set_seq(i + 2);
    auto chunk = sender.chunk(i);
    REQUIRE(chunk.ok());
    *e.mutable_chunk() = std::move(*chunk);
    REQUIRE(c->send(e).ok());
  }
  const size_t expected = sender.num_chunks() + 1;
  REQUIRE(testing::run_until(io, std::chrono::seconds(10),
                             [&] { return server.received.size() == expected; }));

  auto receiver =
      ChunkReceiver::create_buffered(server.received[0].update_upload().transfer(), 64 << 20);
  REQUIRE(receiver.ok());
  for (size_t i = 1; i < server.received.size(); ++i) {
    REQUIRE(receiver->accept(server.received[i].chunk()).ok());
  }
  REQUIRE(receiver->finish().ok());
  CHECK(receiver->ack().complete());
  CHECK(receiver->take_payload() == payload);
}

TEST_CASE("send_chunk and the chunk handler stream without protobuf copies", "[net]") {
  constexpr uint32_t kFrameLimit = 64 * 1024;
  const std::string payload = random_payload(1'000'003, 11);
  testing::TestPki pki;
  const auto server_node = pki.issue("aggregator", CertRole::kServer);
  const auto client_node = pki.issue("client-1", CertRole::kClient);
  asio::io_context io;
  ServerOptions so;
  so.connection.max_frame_bytes = kFrameLimit;
  testing::LoopbackServer server(
      io, {pki.ca_pem(), server_node.cert_pem, server_node.key_pem, "", true}, so);
  server.echo = false;
  ClientOptions co;
  co.connection.max_frame_bytes = kFrameLimit;
  auto conn = testing::connect_client(
      io, {pki.ca_pem(), client_node.cert_pem, client_node.key_pem, "", true}, server.port(), co);
  REQUIRE(conn.ok());
  auto c = *conn;
  ChunkSender sender(9, payload, 60'000);
  // Background hashing on one side, inline on the other: both must agree with the sender.
  auto client_rx =
      ChunkReceiver::create_buffered(sender.header(), 2 << 20, ChunkReceiver::Hashing::kBackground);
  REQUIRE(client_rx.ok());
  std::vector<v1::Envelope> client_messages;
  size_t client_chunks = 0;
  c->set_chunk_handler([&](const wire::ChunkView& chunk) {
    ++client_chunks;
    REQUIRE(client_rx->accept(chunk).ok());
  });
  c->start([&](v1::Envelope e) { client_messages.push_back(std::move(e)); }, [](const Status&) {});

  // Client to server: send_chunk's bytes are what protobuf on the other end expects.
  for (uint64_t i = 0; i < sender.num_chunks(); ++i) {
    auto view = sender.chunk_view(i);
    REQUIRE(view.ok());
    REQUIRE(c->send_chunk(*view).ok());
  }
  auto too_big = sender.chunk_view(0);
  REQUIRE(too_big.ok());
  too_big->data = payload;
  CHECK(c->send_chunk(*too_big).code() == StatusCode::kInvalidArgument);
  REQUIRE(testing::run_until(io, std::chrono::seconds(10),
                             [&] { return server.received.size() == sender.num_chunks(); }));
  auto server_rx = ChunkReceiver::create_buffered(sender.header(), 2 << 20);
  REQUIRE(server_rx.ok());
  for (const auto& e : server.received) REQUIRE(server_rx->accept(e.chunk()).ok());
  REQUIRE(server_rx->finish().ok());
  CHECK(server_rx->take_payload() == payload);

  // Server to client through protobuf send(): every chunk reaches the chunk handler, including
  // one with an unknown field (parsed by protobuf), and other messages the message handler.
  REQUIRE(server.accepted.size() == 1);
  auto& peer = server.accepted[0];
  for (uint64_t i = 0; i < sender.num_chunks(); ++i) {
    v1::Envelope e;
    e.set_seq(i + 1);
    auto chunk = sender.chunk(i);
    REQUIRE(chunk.ok());
    *e.mutable_chunk() = std::move(*chunk);
    if (i == 3) {
      e.mutable_chunk()->GetReflection()->MutableUnknownFields(e.mutable_chunk())->AddVarint(77, 1);
    }
    REQUIRE(peer->send(e).ok());
  }
  v1::Envelope hb;
  hb.mutable_heartbeat()->set_sent_unix_ms(5);
  REQUIRE(peer->send(hb).ok());
  REQUIRE(
      testing::run_until(io, std::chrono::seconds(10), [&] { return !client_messages.empty(); }));
  CHECK(client_chunks == sender.num_chunks());
  REQUIRE(client_messages.size() == 1);
  CHECK(client_messages[0].has_heartbeat());
  REQUIRE(client_rx->finish().ok());
  CHECK(client_rx->take_payload() == payload);
}

TEST_CASE("corrupt chunks are detected, re-requested, and the transfer resumes", "[net]") {
  const std::string payload = random_payload(100'000, 5);
  ChunkSender sender(7, payload, 4096);
  REQUIRE(sender.num_chunks() == 25);
  auto receiver = ChunkReceiver::create_buffered(sender.header(), 1 << 20);
  REQUIRE(receiver.ok());
  auto chunk = [&](uint64_t i) {
    auto c = sender.chunk(i);
    REQUIRE(c.ok());
    return *c;
  };

  for (uint64_t i = 0; i < 10; ++i) REQUIRE(receiver->accept(chunk(i)).ok());

  SECTION("a flipped bit fails the CRC; the resent chunk is accepted") {
    auto bad = chunk(10);
    (*bad.mutable_data())[100] ^= 0x04;
    const Status s = receiver->accept(bad);
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK_THAT(s.message(), Catch::Contains("chunk 10 fails its CRC32C"));
    CHECK(receiver->ack().next_index() == 10);  // what the receiver asks for again
  }
  SECTION("a truncated chunk is rejected") {
    auto bad = chunk(10);
    bad.mutable_data()->resize(100);
    bad.set_crc32c(wire::crc32c(bad.data()));
    CHECK(receiver->accept(bad).code() == StatusCode::kDataLoss);
  }
  SECTION("the connection drops; the sender resumes from the last acknowledgement") {
    CHECK(receiver->accept(chunk(12)).code() == StatusCode::kOutOfRange);  // a gap
    CHECK(receiver->accept(chunk(3)).ok());                                // old resend: ignored
  }
  for (uint64_t i = receiver->ack().next_index(); i < sender.num_chunks(); ++i) {
    REQUIRE(receiver->accept(chunk(i)).ok());
  }
  REQUIRE(receiver->finish().ok());
  CHECK(receiver->take_payload() == payload);
}

TEST_CASE("the whole-payload SHA-256 catches what chunk CRCs cannot", "[net]") {
  const auto hashing =
      GENERATE(ChunkReceiver::Hashing::kInline, ChunkReceiver::Hashing::kBackground);
  const std::string payload = random_payload(10'000, 9);
  ChunkSender sender(1, payload, 1000);
  auto receiver = ChunkReceiver::create_buffered(sender.header(), 1 << 20, hashing);
  REQUIRE(receiver.ok());
  for (uint64_t i = 0; i < sender.num_chunks(); ++i) {
    auto c = *sender.chunk(i);
    if (i == 4) {  // altered together with its CRC, as a faulty sender might
      (*c.mutable_data())[0] ^= 1;
      c.set_crc32c(wire::crc32c(c.data()));
    }
    REQUIRE(receiver->accept(c).ok());
  }
  const Status s = receiver->finish();
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK_THAT(s.message(), Catch::Contains("SHA-256"));
}

TEST_CASE("a helper thread hashing copies, or reading back what the sink stored, agrees", "[net]") {
  // Over 8 MiB, so that copies wait for the helper; chunks short enough to sit inside a
  // std::string (small-string storage) and longer ones.
  const uint32_t chunk_bytes = GENERATE(7u, 100'000u);
  const size_t size = chunk_bytes < 100 ? 50'000 : 9'000'000;
  const std::string payload = random_payload(size, 11);
  ChunkSender sender(2, payload, chunk_bytes);
  const bool read_back = GENERATE(false, true);
  const bool corrupt = GENERATE(false, true);
  std::string stored(size, '\0');
  std::atomic<uint64_t> stored_end{0};  // the sink runs here, the read-back on the helper
  auto receiver = ChunkReceiver::create(
      sender.header(), 16 << 20,
      [&](uint64_t offset, std::string_view data) {
        if (offset != stored_end.load()) return internal_error("sink out of order");
        std::memcpy(stored.data() + offset, data.data(), data.size());
        stored_end.store(offset + data.size());
        return ok_status();
      },
      ChunkReceiver::Hashing::kBackground,
      read_back ? ChunkReceiver::ReadBack([&](uint64_t offset, std::span<char> out) {
        // The helper may read only what the sink has stored.
        if (offset + out.size() > stored_end.load()) return internal_error("read past the sink");
        std::memcpy(out.data(), stored.data() + offset, out.size());
        return ok_status();
      })
                : ChunkReceiver::ReadBack());
  REQUIRE(receiver.ok());
  for (uint64_t i = 0; i < sender.num_chunks(); ++i) {
    auto c = *sender.chunk(i);
    if (corrupt && i == sender.num_chunks() - 1) {
      (*c.mutable_data())[0] ^= 0x10;
      c.set_crc32c(wire::crc32c(c.data()));
    }
    REQUIRE(receiver->accept(c).ok());
  }
  CHECK(receiver->finish().code() == (corrupt ? StatusCode::kDataLoss : StatusCode::kOk));
  if (!corrupt) CHECK(stored == payload);
}

TEST_CASE("a failed read-back fails the transfer, naming it", "[net]") {
  const std::string payload = random_payload(3'000'000, 12);
  ChunkSender sender(4, payload, 100'000);
  auto receiver = ChunkReceiver::create(
      sender.header(), 4 << 20, [](uint64_t, std::string_view) { return ok_status(); },
      ChunkReceiver::Hashing::kBackground,
      [](uint64_t, std::span<char>) { return data_loss("spill file truncated"); });
  REQUIRE(receiver.ok());
  for (uint64_t i = 0; i < sender.num_chunks(); ++i)
    REQUIRE(receiver->accept(*sender.chunk(i)).ok());
  const Status s = receiver->finish();
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK_THAT(s.message(), Catch::Contains("transfer 4"));
  CHECK_THAT(s.message(), Catch::Contains("spill file truncated"));
}

TEST_CASE("a receiver dropped mid-transfer stops its helper thread cleanly", "[net]") {
  const std::string payload = random_payload(2'000'000, 13);
  ChunkSender sender(3, payload, 100'000);
  for (const bool buffered : {true, false}) {
    auto receiver = buffered ? ChunkReceiver::create_buffered(sender.header(), 4 << 20,
                                                              ChunkReceiver::Hashing::kBackground)
                             : ChunkReceiver::create(
                                   sender.header(), 4 << 20,
                                   [](uint64_t, std::string_view) { return ok_status(); },
                                   ChunkReceiver::Hashing::kBackground);
    REQUIRE(receiver.ok());
    // Queued work left behind: in place (the buffer must outlive the helper's reads) or copied.
    for (uint64_t i = 0; i < sender.num_chunks() / 2; ++i) {
      REQUIRE(receiver->accept(*sender.chunk(i)).ok());
    }
    auto replaced = ChunkReceiver::create_buffered(sender.header(), 4 << 20);
    REQUIRE(replaced.ok());
    *receiver = std::move(*replaced);  // assigning over it drops the old transfer too
    for (uint64_t i = 0; i < sender.num_chunks(); ++i) {
      REQUIRE(receiver->accept(*sender.chunk(i)).ok());
    }
    REQUIRE(receiver->finish().ok());
    CHECK(receiver->take_payload() == payload);
  }
}

TEST_CASE("untrusted transfer headers are validated", "[net]") {
  ChunkSender sender(1, "0123456789", 4);
  CHECK(sender.num_chunks() == 3);
  auto header = sender.header();
  CHECK(ChunkReceiver::create_buffered(header, 9).status().code() ==
        StatusCode::kResourceExhausted);
  auto h = header;
  h.set_chunk_bytes(0);
  CHECK_FALSE(ChunkReceiver::create_buffered(h, 100).ok());
  h = header;
  h.set_num_chunks(1ull << 60);
  CHECK_FALSE(ChunkReceiver::create_buffered(h, 100).ok());
  h = header;
  h.set_sha256("short");
  CHECK_FALSE(ChunkReceiver::create_buffered(h, 100).ok());
  auto r = ChunkReceiver::create_buffered(header, 100);
  REQUIRE(r.ok());
  auto c = *sender.chunk(0);
  c.set_transfer_id(2);
  CHECK(r->accept(c).code() == StatusCode::kInvalidArgument);
  CHECK(r->finish().code() == StatusCode::kFailedPrecondition);
  CHECK(sender.chunk(3).status().code() == StatusCode::kOutOfRange);
  ChunkSender empty(3, "", 4);
  auto er = ChunkReceiver::create_buffered(empty.header(), 100);
  REQUIRE(er.ok());
  CHECK(er->finish().ok());
}

TEST_CASE("a quiet connection gives back its frame buffers and still works", "[net]") {
  testing::TestPki pki;
  const auto server_node = pki.issue("aggregator", CertRole::kServer);
  const auto client_node = pki.issue("client-1", CertRole::kClient);
  asio::io_context io;
  testing::LoopbackServer server(
      io, {pki.ca_pem(), server_node.cert_pem, server_node.key_pem, "", true});
  server.echo = false;
  auto conn = testing::connect_client(
      io, {pki.ca_pem(), client_node.cert_pem, client_node.key_pem, "", true}, server.port());
  REQUIRE(conn.ok());
  auto c = *conn;
  c->start([](v1::Envelope) {}, [](const Status&) {});

  const std::string payload = random_payload(3 * 300'000, 5);
  auto send_all = [&](size_t first_seq) {
    for (size_t i = 0; i < 3; ++i) {
      v1::Envelope e;
      e.set_seq(first_seq + i);
      e.mutable_chunk()->set_data(payload.substr(i * 300'000, 300'000));
      REQUIRE(c->send(e).ok());
    }
  };
  send_all(1);
  REQUIRE(testing::run_until(io, std::chrono::seconds(10), [&] {
    return server.received.size() == 3 && c->queued_bytes() == 0;
  }));
  REQUIRE(server.accepted.size() == 1);
  auto& peer = *server.accepted[0];
  // Right after the transfer both ends still hold frame-sized buffers for the next one...
  CHECK(peer.buffer_bytes() >= 300'000);
  CHECK(c->buffer_bytes() >= 300'000);
  // ...and give them back once the connection has been quiet for a while.
  CHECK(testing::run_until(io, std::chrono::seconds(5),
                           [&] { return peer.buffer_bytes() == 0 && c->buffer_bytes() == 0; }));
  send_all(4);
  REQUIRE(testing::run_until(io, std::chrono::seconds(10),
                             [&] { return server.received.size() == 6; }));
  for (size_t i = 0; i < 6; ++i) {
    CHECK(server.received[i].seq() == i + 1);
    CHECK(server.received[i].chunk().data() == payload.substr((i % 3) * 300'000, 300'000));
  }
}

}  // namespace
}  // namespace starling::net
