// Loopback helpers for network tests: run_until() drives an io_context under a deadline (a
// hang fails the test, nothing sleeps), LoopbackServer records what a TLS server sees.
// Header-only: starling_testing is built without the network libraries; tests that include
// this link starling_core_net.
#pragma once

#include <asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include "core/net/client.h"
#include "core/net/server.h"

namespace starling::testing {

// Runs handlers until done() is true or `deadline` passes; returns done().
inline bool run_until(asio::io_context& io, std::chrono::milliseconds deadline,
                      const std::function<bool()>& done) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    if (io.stopped()) io.restart();
    io.run_one_for(std::chrono::milliseconds(10));
  }
  return true;
}

// net::connect() to 127.0.0.1:`port` with `config`'s identity, driven to completion: the
// connection (not started), the connect error, or DeadlineExceeded after `deadline`.
// `options` may set the connection options; its host and port are overwritten.
inline Result<std::shared_ptr<net::Connection>> connect_client(
    asio::io_context& io, const net::TlsConfig& config, uint16_t port,
    net::ClientOptions options = {},
    std::chrono::milliseconds deadline = std::chrono::milliseconds(5000)) {
  auto ctx = net::make_tls_context(config, net::TlsSide::kClient);
  if (!ctx.ok()) return ctx.status();
  options.host = "127.0.0.1";
  options.port = port;
  std::optional<Result<std::shared_ptr<net::Connection>>> result;
  net::connect(io, *ctx, options,
               [&](Result<std::shared_ptr<net::Connection>> r) { result.emplace(std::move(r)); });
  if (!run_until(io, deadline, [&] { return result.has_value(); })) {
    return deadline_exceeded("connect to 127.0.0.1:" + std::to_string(port) + " did not finish");
  }
  return std::move(*result);
}

// A TLS server on 127.0.0.1, port 0, recording connections, messages, rejections and closes.
// With echo on, it answers every message with an Ack of its seq.
class LoopbackServer {
 public:
  LoopbackServer(asio::io_context& io, const net::TlsConfig& config,
                 net::ServerOptions options = {}) {
    auto ctx_or = net::make_tls_context(config, net::TlsSide::kServer);
    if (!ctx_or.ok()) throw std::runtime_error(ctx_or.status().to_string());
    auto s = net::Server::listen(
        io, *ctx_or, std::move(options),
        [this](std::shared_ptr<net::Connection> c) {
          accepted.push_back(c);
          c->start(
              [this, weak = std::weak_ptr<net::Connection>(c)](v1::Envelope e) {
                received.push_back(e);
                auto conn = weak.lock();
                if (echo && conn) {
                  v1::Envelope ack;
                  ack.mutable_ack()->set_seq(e.seq());
                  (void)conn->send(ack);
                }
              },
              [this](const Status& st) { closed.push_back(st); });
        },
        [this](const Status& st) { rejected.push_back(st); });
    if (!s.ok()) throw std::runtime_error(s.status().to_string());
    server = std::move(*s);
    ctx = *ctx_or;
  }

  uint16_t port() const { return server->port(); }

  std::shared_ptr<asio::ssl::context> ctx;  // the server's (net::reload_trust replaces its store)
  std::vector<std::shared_ptr<net::Connection>> accepted;
  std::vector<v1::Envelope> received;
  std::vector<Status> rejected;
  std::vector<Status> closed;
  bool echo = true;
  std::unique_ptr<net::Server> server;
};

}  // namespace starling::testing
