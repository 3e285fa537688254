// Mutual TLS over real sockets on 127.0.0.1: the successful exchange and every rejection.
#include <algorithm>
#include <asio/connect.hpp>
#include <asio/write.hpp>
#include <catch2/catch.hpp>
#include <optional>

#include "core/net/client.h"
#include "tests/testing/loopback.h"
#include "tests/testing/tls_fixtures.h"

namespace starling::net {
namespace {

using Catch::Contains;
using testing::LoopbackServer;
using testing::run_until;
using testing::TestNode;
using testing::TestPki;

constexpr Millis kWait{5000};  // overall deadline of every wait in these tests

TlsConfig config_of(const TestPki& pki, const TestNode& node) {
  return TlsConfig{pki.ca_pem(), node.cert_pem, node.key_pem, "", true};
}

ServerOptions fast_server() {
  ServerOptions o;
  o.connection.deadlines.handshake = Millis(2000);
  o.connection.deadlines.idle = Millis(2000);
  o.connection.deadlines.frame = Millis(200);
  return o;
}

std::shared_ptr<asio::ssl::context> client_ctx(const TlsConfig& config) {
  auto ctx = make_tls_context(config, TlsSide::kClient);
  REQUIRE(ctx.ok());
  return *ctx;
}

// connect() driven to completion: the result (DeadlineExceeded after kWait).
Result<std::shared_ptr<Connection>> connect_now(asio::io_context& io, const TlsConfig& config,
                                                uint16_t port,
                                                const std::string& server_name = "127.0.0.1") {
  ClientOptions o;
  o.server_name = server_name;
  return testing::connect_client(io, config, port, o, kWait);
}

// A TLS client that writes arbitrary bytes: the misbehaving peer of the negative tests.
struct RawTlsPeer {
  RawTlsPeer(asio::io_context& io, const TlsConfig& config)
      : ctx(client_ctx(config)), stream(io, *ctx) {}

  void connect(asio::io_context& io, uint16_t port) {
    std::optional<asio::error_code> result;
    stream.lowest_layer().async_connect(
        {asio::ip::make_address("127.0.0.1"), port}, [&](const asio::error_code& ec) {
          if (ec) return result.emplace(ec), void();
          stream.async_handshake(asio::ssl::stream_base::client,
                                 [&](const asio::error_code& e) { result.emplace(e); });
        });
    REQUIRE(run_until(io, kWait, [&] { return result.has_value(); }));
    REQUIRE_FALSE(*result);
  }

  void write(asio::io_context& io, const std::string& bytes) {
    bool written = false;
    asio::async_write(stream, asio::buffer(bytes),
                      [&](const asio::error_code&, size_t) { written = true; });
    REQUIRE(run_until(io, kWait, [&] { return written; }));
  }

  std::shared_ptr<asio::ssl::context> ctx;
  SslStream stream;
};

std::string frame_header(uint32_t n) {
  return std::string{static_cast<char>(n >> 24), static_cast<char>(n >> 16),
                     static_cast<char>(n >> 8), static_cast<char>(n)};
}

struct Federation {
  TestPki pki;
  TestNode server = pki.issue("aggregator", CertRole::kServer);
  TestNode client = pki.issue("client-1", CertRole::kClient);
};

TEST_CASE("mutual TLS handshake and message exchange", "[net]") {
  Federation fed;
  asio::io_context io;
  LoopbackServer server(io, config_of(fed.pki, fed.server), fast_server());
  auto conn = connect_now(io, config_of(fed.pki, fed.client), server.port());
  REQUIRE(conn.ok());
  auto& c = *conn;
  CHECK(c->peer().node_id == "aggregator");
  CHECK(c->peer().role == "server");

  std::vector<v1::Envelope> replies;
  std::optional<Status> client_closed;
  c->start([&](v1::Envelope e) { replies.push_back(std::move(e)); },
           [&](const Status& s) { client_closed = s; });
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    v1::Envelope hello;
    hello.set_seq(seq);
    hello.mutable_hello()->set_node_id("client-1");
    hello.mutable_hello()->set_role(v1::ROLE_CLIENT);
    REQUIRE(c->send(hello).ok());
  }
  REQUIRE(run_until(io, kWait, [&] { return replies.size() == 3; }));
  REQUIRE(server.accepted.size() == 1);
  CHECK(server.accepted[0]->peer().node_id == "client-1");
  CHECK(server.accepted[0]->peer().role == "client");
  CHECK(server.received.size() == 3);
  CHECK(replies[2].ack().seq() == 3);
  CHECK(server.server->connection_count() == 1);

  c->close();
  const bool done =
      run_until(io, kWait, [&] { return client_closed.has_value() && server.closed.size() == 1; });
  INFO("client closed: " << client_closed.has_value()
                         << ", server closed: " << server.closed.size());
  REQUIRE(done);
  CHECK(client_closed->ok());
  CHECK(server.closed[0].ok());
  CHECK(server.server->connection_count() == 0);
  CHECK(c->send(v1::Envelope()).code() == StatusCode::kFailedPrecondition);
}

TEST_CASE("certificate problems are rejected with a clear error", "[net]") {
  Federation fed;
  asio::io_context io;
  TestPki other("other-federation");

  SECTION("client certificate from an unknown CA") {
    LoopbackServer server(io, config_of(fed.pki, fed.server), fast_server());
    TestNode stranger = other.issue("client-1", CertRole::kClient);
    auto client_config = config_of(fed.pki, stranger);  // trusts our CA, signed by another
    auto conn = connect_now(io, client_config, server.port());
    REQUIRE(run_until(io, kWait, [&] { return server.rejected.size() == 1; }));
    CHECK(server.rejected[0].code() == StatusCode::kUnauthenticated);
    CHECK_THAT(server.rejected[0].message(), Contains("unable to get local issuer certificate"));
    CHECK_THAT(server.rejected[0].message(), Contains("127.0.0.1"));
    CHECK(server.accepted.empty());
  }
  SECTION("server certificate from an unknown CA") {
    TestNode stranger = other.issue("aggregator", CertRole::kServer);
    LoopbackServer server(io, config_of(other, stranger), fast_server());
    auto conn = connect_now(io, config_of(fed.pki, fed.client), server.port());
    REQUIRE_FALSE(conn.ok());
    CHECK(conn.status().code() == StatusCode::kUnauthenticated);
    CHECK_THAT(conn.status().message(), Contains("certificate verify failed"));
  }
  SECTION("expired client certificate") {
    LoopbackServer server(io, config_of(fed.pki, fed.server), fast_server());
    TestNode expired =
        fed.pki.issue("client-1", CertRole::kClient, {"DNS:localhost"}, -2 * 86400, -86400);
    auto conn = connect_now(io, config_of(fed.pki, expired), server.port());
    REQUIRE(run_until(io, kWait, [&] { return server.rejected.size() == 1; }));
    CHECK_THAT(server.rejected[0].message(), Contains("certificate has expired"));
  }
  SECTION("expired server certificate") {
    TestNode expired =
        fed.pki.issue("aggregator", CertRole::kServer, {"IP:127.0.0.1"}, -2 * 86400, -86400);
    LoopbackServer server(io, config_of(fed.pki, expired), fast_server());
    auto conn = connect_now(io, config_of(fed.pki, fed.client), server.port());
    REQUIRE_FALSE(conn.ok());
    CHECK_THAT(conn.status().message(), Contains("certificate has expired"));
  }
  SECTION("server certificate for another name") {
    LoopbackServer server(io, config_of(fed.pki, fed.server), fast_server());
    auto conn =
        connect_now(io, config_of(fed.pki, fed.client), server.port(), "aggregator.example");
    REQUIRE_FALSE(conn.ok());
    CHECK(conn.status().code() == StatusCode::kUnauthenticated);
    CHECK_THAT(conn.status().message(), Contains("hostname mismatch"));
  }
  SECTION("a client-only certificate cannot serve") {
    LoopbackServer server(io, config_of(fed.pki, fed.client), fast_server());
    auto conn = connect_now(io, config_of(fed.pki, fed.client), server.port());
    REQUIRE_FALSE(conn.ok());
    CHECK_THAT(conn.status().message(), Contains("unsuitable certificate purpose"));
  }
  SECTION("revoked client certificate") {
    auto server_config = config_of(fed.pki, fed.server);
    server_config.crl_pem = fed.pki.crl_pem({&fed.client});
    LoopbackServer server(io, server_config, fast_server());
    auto conn = connect_now(io, config_of(fed.pki, fed.client), server.port());
    REQUIRE(run_until(io, kWait, [&] { return server.rejected.size() == 1; }));
    CHECK_THAT(server.rejected[0].message(), Contains("certificate revoked"));
    TestNode good = fed.pki.issue("client-2", CertRole::kClient);
    auto ok_conn = connect_now(io, config_of(fed.pki, good), server.port());
    REQUIRE(ok_conn.ok());
    REQUIRE(run_until(io, kWait, [&] { return server.accepted.size() == 1; }));
  }
  SECTION("a CRL reloaded while serving refuses a certificate that was accepted before") {
    auto server_config = config_of(fed.pki, fed.server);
    LoopbackServer server(io, server_config, fast_server());
    auto first = connect_now(io, config_of(fed.pki, fed.client), server.port());
    REQUIRE(first.ok());
    REQUIRE(run_until(io, kWait, [&] { return server.accepted.size() == 1; }));
    CHECK(server.accepted[0]->peer().serial == net::cert_serial_hex(fed.client.cert.get()));
    server_config.crl_pem = fed.pki.crl_pem({&fed.client});
    REQUIRE(net::reload_trust(*server.ctx, server_config).ok());
    auto second = connect_now(io, config_of(fed.pki, fed.client), server.port());
    REQUIRE(run_until(io, kWait, [&] { return server.rejected.size() == 1; }));
    // The error names who was refused, though OpenSSL keeps no peer certificate then.
    CHECK_THAT(server.rejected[0].message(),
               Contains("certificate revoked") && Contains("CN=client-1"));
    // A malformed list is refused and the store in force stays.
    server_config.crl_pem = "-----BEGIN X509 CRL-----\ngarbage\n-----END X509 CRL-----\n";
    CHECK_FALSE(net::reload_trust(*server.ctx, server_config).ok());
    TestNode good = fed.pki.issue("client-2", CertRole::kClient);
    auto ok_conn = connect_now(io, config_of(fed.pki, good), server.port());
    REQUIRE(ok_conn.ok());
    REQUIRE(run_until(io, kWait, [&] { return server.accepted.size() == 2; }));
  }
  SECTION("missing client certificate") {
    LoopbackServer server(io, config_of(fed.pki, fed.server), fast_server());
    auto ctx = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_client);
    SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_3_VERSION);
    ctx->add_certificate_authority(asio::buffer(fed.pki.ca_pem()));
    ctx->set_verify_mode(asio::ssl::verify_peer);
    SslStream stream(io, *ctx);
    bool handshaken = false;
    stream.lowest_layer().async_connect(
        {asio::ip::make_address("127.0.0.1"), server.port()}, [&](const asio::error_code& ec) {
          REQUIRE_FALSE(ec);
          stream.async_handshake(asio::ssl::stream_base::client,
                                 [&](const asio::error_code&) { handshaken = true; });
        });
    REQUIRE(run_until(io, kWait, [&] { return handshaken && server.rejected.size() == 1; }));
    CHECK(server.rejected[0].code() == StatusCode::kUnauthenticated);
    CHECK_THAT(server.rejected[0].message(), Contains("peer did not return a certificate"));
  }
  SECTION("TLS below 1.3") {
    LoopbackServer server(io, config_of(fed.pki, fed.server), fast_server());
    auto ctx = client_ctx(config_of(fed.pki, fed.client));
    SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION);
    SSL_CTX_set_max_proto_version(ctx->native_handle(), TLS1_2_VERSION);
    std::optional<Result<std::shared_ptr<Connection>>> result;
    ClientOptions o;
    o.host = "127.0.0.1";
    o.port = server.port();
    connect(io, ctx, o,
            [&](Result<std::shared_ptr<Connection>> r) { result.emplace(std::move(r)); });
    REQUIRE(run_until(io, kWait, [&] { return result && server.rejected.size() == 1; }));
    REQUIRE_FALSE(result->ok());
    CHECK_THAT(server.rejected[0].message(), Contains("unsupported protocol"));
  }
  SECTION("a key that does not match the certificate") {
    TlsConfig mixed = config_of(fed.pki, fed.client);
    mixed.key_pem = fed.server.key_pem;
    auto ctx = make_tls_context(mixed, TlsSide::kClient);
    REQUIRE_FALSE(ctx.ok());
    CHECK_THAT(ctx.status().message(), Contains("does not match"));
  }
}

TEST_CASE("plaintext and silent peers are refused", "[net]") {
  Federation fed;
  asio::io_context io;
  LoopbackServer server(io, config_of(fed.pki, fed.server), [] {
    auto o = fast_server();
    o.connection.deadlines.handshake = Millis(200);
    return o;
  }());
  asio::ip::tcp::socket socket(io);
  bool connected = false;
  socket.async_connect({asio::ip::make_address("127.0.0.1"), server.port()},
                       [&](const asio::error_code& ec) { connected = !ec; });
  REQUIRE(run_until(io, kWait, [&] { return connected; }));

  SECTION("plaintext peer") {
    const std::string request = "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n";
    asio::async_write(socket, asio::buffer(request), [](const asio::error_code&, size_t) {});
    REQUIRE(run_until(io, kWait, [&] { return server.rejected.size() == 1; }));
    CHECK(server.rejected[0].code() == StatusCode::kUnauthenticated);
    CHECK_THAT(server.rejected[0].message(), Contains("does not speak TLS"));
  }
  SECTION("peer that never starts the handshake") {
    REQUIRE(run_until(io, kWait, [&] { return server.rejected.size() == 1; }));
    CHECK(server.rejected[0].code() == StatusCode::kDeadlineExceeded);
    CHECK_THAT(server.rejected[0].message(), Contains("200 ms"));
  }
  CHECK(server.server->connection_count() == 0);
}

TEST_CASE("bad frames close the connection, never the process", "[net]") {
  Federation fed;
  asio::io_context io;
  LoopbackServer server(io, config_of(fed.pki, fed.server), [] {
    auto o = fast_server();
    o.connection.max_frame_bytes = 1 << 20;
    return o;
  }());
  RawTlsPeer peer(io, config_of(fed.pki, fed.client));
  peer.connect(io, server.port());
  const auto closed = [&] { return server.closed.size() == 1; };

  SECTION("oversized length") {
    peer.write(io, frame_header(0xFFFFFFF0u));
    REQUIRE(run_until(io, kWait, closed));
    CHECK(server.closed[0].code() == StatusCode::kDataLoss);
    CHECK_THAT(server.closed[0].message(), Contains("exceeds the limit"));
    CHECK_THAT(server.closed[0].message(), Contains("client-1"));
  }
  SECTION("garbage bytes") {
    peer.write(io, frame_header(6) + "\xff\xff\xff\xff\xff\xff");
    REQUIRE(run_until(io, kWait, closed));
    CHECK(server.closed[0].code() == StatusCode::kDataLoss);
    CHECK_THAT(server.closed[0].message(), Contains("malformed envelope"));
  }
  SECTION("truncated frame: the socket closes mid-frame") {
    peer.write(io, frame_header(100) + "only ten b");
    asio::error_code ignored;
    peer.stream.lowest_layer().close(ignored);
    REQUIRE(run_until(io, kWait, closed));
    CHECK(server.closed[0].code() == StatusCode::kDataLoss);
    CHECK_THAT(server.closed[0].message(), Contains("in the middle of a frame (14 bytes"));
  }
  SECTION("peer closes TLS cleanly mid-message") {
    peer.write(io, frame_header(100) + "only ten b");
    peer.stream.async_shutdown([](const asio::error_code&) {});
    REQUIRE(run_until(io, kWait, closed));
    CHECK(server.closed[0].code() == StatusCode::kDataLoss);
    CHECK_THAT(server.closed[0].message(), Contains("in the middle of a frame"));
  }
  SECTION("slow peer exceeds the frame deadline") {
    const auto start = std::chrono::steady_clock::now();
    peer.write(io, frame_header(100) + "slow");
    REQUIRE(run_until(io, kWait, closed));
    CHECK(server.closed[0].code() == StatusCode::kDeadlineExceeded);
    CHECK_THAT(server.closed[0].message(), Contains("incomplete after 200 ms"));
    CHECK(std::chrono::steady_clock::now() - start >= Millis(200));
  }
  CHECK(server.received.empty());
  CHECK(server.server->connection_count() == 0);
}

TEST_CASE("a message type from a newer protocol is skipped, not fatal", "[net]") {
  Federation fed;
  asio::io_context io;
  LoopbackServer server(io, config_of(fed.pki, fed.server), fast_server());
  RawTlsPeer peer(io, config_of(fed.pki, fed.client));
  peer.connect(io, server.port());
  const std::string unknown = "\xe2\x03\x02hi";  // field 60, length-delimited "hi"
  v1::Envelope hello;
  hello.set_seq(2);
  hello.mutable_hello()->set_node_id("client-1");
  const std::string known = hello.SerializeAsString();
  peer.write(io, frame_header(static_cast<uint32_t>(unknown.size())) + unknown +
                     frame_header(static_cast<uint32_t>(known.size())) + known);
  REQUIRE(run_until(io, kWait, [&] { return server.received.size() == 1; }));
  CHECK(server.received[0].hello().node_id() == "client-1");
  CHECK(server.closed.empty());
}

TEST_CASE("idle connections time out and the connection limit holds", "[net]") {
  Federation fed;
  asio::io_context io;
  auto options = fast_server();
  options.connection.deadlines.idle = Millis(300);
  options.max_connections = 1;
  LoopbackServer server(io, config_of(fed.pki, fed.server), options);
  auto first = connect_now(io, config_of(fed.pki, fed.client), server.port());
  REQUIRE(first.ok());
  REQUIRE(run_until(io, kWait, [&] { return server.accepted.size() == 1; }));

  auto second = connect_now(io, config_of(fed.pki, fed.client), server.port());
  REQUIRE(run_until(io, kWait, [&] { return server.rejected.size() == 1; }));
  CHECK(server.rejected[0].code() == StatusCode::kResourceExhausted);
  CHECK_THAT(server.rejected[0].message(), Contains("connection limit of 1"));
  CHECK_FALSE(second.ok());

  REQUIRE(run_until(io, kWait, [&] { return server.closed.size() == 1; }));
  CHECK(server.closed[0].code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(server.closed[0].message(), Contains("no frame from client-1"));
  auto third = connect_now(io, config_of(fed.pki, fed.client), server.port());
  CHECK(third.ok());
}

TEST_CASE("connections beyond max_handshakes wait their turn and all get through", "[net]") {
  Federation fed;
  asio::io_context io;
  auto options = fast_server();
  options.max_handshakes = 1;
  LoopbackServer server(io, config_of(fed.pki, fed.server), options);
  std::vector<std::optional<Result<std::shared_ptr<Connection>>>> results(6);
  for (auto& result : results) {  // all at once: five wait in the accept queue
    ClientOptions o;
    o.host = "127.0.0.1";
    o.port = server.port();
    o.server_name = "127.0.0.1";
    connect(io, client_ctx(config_of(fed.pki, fed.client)), o,
            [&result](Result<std::shared_ptr<Connection>> r) { result.emplace(std::move(r)); });
  }
  REQUIRE(run_until(io, kWait, [&] {
    return server.accepted.size() == results.size() &&
           std::all_of(results.begin(), results.end(), [](const auto& r) { return r.has_value(); });
  }));
  for (const auto& r : results) CHECK(r->ok());
  CHECK(server.rejected.empty());
}

TEST_CASE("backpressure: send refuses beyond the queue limit", "[net]") {
  Federation fed;
  asio::io_context io;
  LoopbackServer server(io, config_of(fed.pki, fed.server), fast_server());
  ClientOptions o;
  o.host = "127.0.0.1";
  o.port = server.port();
  o.connection.max_queue_bytes = 1000;
  std::optional<Result<std::shared_ptr<Connection>>> result;
  connect(io, client_ctx(config_of(fed.pki, fed.client)), o,
          [&](Result<std::shared_ptr<Connection>> r) { result.emplace(std::move(r)); });
  REQUIRE(run_until(io, kWait, [&] { return result.has_value(); }));
  REQUIRE(result->ok());
  auto conn = **result;
  v1::Envelope e;
  e.mutable_chunk()->set_data(std::string(400, 'x'));
  CHECK(conn->send(e).ok());
  CHECK(conn->send(e).ok());
  const Status full = conn->send(e);
  CHECK(full.code() == StatusCode::kResourceExhausted);
  CHECK_THAT(full.message(), Contains("aggregator"));
  bool drained = false;
  conn->set_drain_handler([&] { drained = true; });
  conn->start([](v1::Envelope) {}, [](const Status&) {});
  REQUIRE(run_until(io, kWait, [&] { return drained; }));
  CHECK(conn->queued_bytes() == 0);
  CHECK(conn->send(e).ok());
}

TEST_CASE("reconnect with exponential backoff and jitter", "[net]") {
  SECTION("delays grow, are capped, and stay within the jitter") {
    Backoff b({Millis(100), Millis(1000), 2.0, 0.2, 0}, Rng(7));
    const double base[] = {100, 200, 400, 800, 1000, 1000};
    for (double expected : base) {
      const auto d = static_cast<double>(b.next().count());
      CHECK(d >= expected * 0.8 - 1);
      CHECK(d <= expected * 1.2 + 1);
    }
    b.reset();
    CHECK(b.attempts() == 0);
    Backoff again({Millis(100), Millis(1000), 2.0, 0.2, 0}, Rng(7));
    Backoff same({Millis(100), Millis(1000), 2.0, 0.2, 0}, Rng(7));
    CHECK(again.next() == same.next());
  }
  SECTION("gives up after max_attempts on a closed port") {
    asio::io_context io;
    uint16_t port = 0;
    {
      asio::ip::tcp::acceptor a(io, {asio::ip::make_address("127.0.0.1"), 0});
      port = a.local_endpoint().port();
    }
    Federation fed;
    ClientOptions o;
    o.host = "127.0.0.1";
    o.port = port;
    std::optional<Result<std::shared_ptr<Connection>>> result;
    connect_with_retry(
        io, client_ctx(config_of(fed.pki, fed.client)), o, {Millis(10), Millis(40), 2.0, 0.5, 3},
        Rng(1), [&](Result<std::shared_ptr<Connection>> r) { result.emplace(std::move(r)); });
    REQUIRE(run_until(io, kWait, [&] { return result.has_value(); }));
    REQUIRE_FALSE(result->ok());
    CHECK(result->status().code() == StatusCode::kUnavailable);
    CHECK_THAT(result->status().message(), Contains("after 3 attempts"));
    CHECK_THAT(result->status().message(), Contains("127.0.0.1:" + std::to_string(port)));
  }
  SECTION("stops at once on a certificate error") {
    asio::io_context io;
    Federation fed;
    TestPki other("other-federation");
    TestNode stranger = other.issue("aggregator", CertRole::kServer);
    LoopbackServer server(io, config_of(other, stranger), fast_server());
    ClientOptions o;
    o.host = "127.0.0.1";
    o.port = server.port();
    std::optional<Result<std::shared_ptr<Connection>>> result;
    connect_with_retry(
        io, client_ctx(config_of(fed.pki, fed.client)), o, {Millis(10), Millis(40), 2.0, 0.5, 5},
        Rng(1), [&](Result<std::shared_ptr<Connection>> r) { result.emplace(std::move(r)); });
    REQUIRE(run_until(io, kWait, [&] { return result.has_value(); }));
    CHECK(result->status().code() == StatusCode::kUnauthenticated);
    CHECK_THAT(result->status().message(), Contains("after 1 attempts"));
  }
}

}  // namespace
}  // namespace starling::net
