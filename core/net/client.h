// Client side: connect to a server with deadlines on connect and handshake, verifying that
// the server's certificate names the expected node; reconnect with exponential backoff.
#pragma once

#include <asio/io_context.hpp>
#include <asio/ssl/context.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/net/connection.h"
#include "core/util/rng.h"
#include "core/util/status.h"

namespace starling::net {

struct ClientOptions {
  std::string host;  // name or address to connect to
  uint16_t port = 0;
  // Identity the server certificate must carry (DNS or IP SAN; CN when it has no DNS SAN).
  // Empty: `host`.
  std::string server_name;
  ConnectionOptions connection;
};

using ConnectHandler = std::function<void(Result<std::shared_ptr<Connection>>)>;

// Connects, then calls `done` exactly once on the io_context thread. Errors name the server:
// Unavailable (refused, unreachable), DeadlineExceeded, Unauthenticated (TLS or certificate).
// REQUIRES: ctx made with TlsSide::kClient; `io` run by one thread.
void connect(asio::io_context& io, std::shared_ptr<asio::ssl::context> ctx, ClientOptions options,
             ConnectHandler done);

struct BackoffOptions {
  Millis initial{200};
  Millis max{30'000};
  double multiplier = 2.0;
  double jitter = 0.2;   // each delay is scaled by a uniform factor in [1 - jitter, 1 + jitter]
  int max_attempts = 0;  // connection attempts in all; 0: no limit
};

// Exponential backoff with jitter. Deterministic for a given Rng seed.
class Backoff {
 public:
  Backoff(BackoffOptions options, Rng rng) : options_(options), rng_(rng) {}
  // The delay before the next attempt; grows by `multiplier` up to `max`.
  Millis next();
  void reset() { attempt_ = 0; }
  int attempts() const { return attempt_; }

 private:
  BackoffOptions options_;
  Rng rng_;
  int attempt_ = 0;
};

// connect() until it succeeds, waiting backoff.next() between attempts. Retries only errors
// that time may cure (Unavailable, DeadlineExceeded); certificate errors end at once.
void connect_with_retry(asio::io_context& io, std::shared_ptr<asio::ssl::context> ctx,
                        ClientOptions options, BackoffOptions backoff, Rng rng,
                        ConnectHandler done);

}  // namespace starling::net
