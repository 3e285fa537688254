// Client connect: resolve, TCP connect and TLS handshake, each beside a deadline timer.
#include "core/net/client.h"

#include <openssl/x509v3.h>

#include <algorithm>
#include <asio/connect.hpp>
#include <asio/ip/address.hpp>
#include <asio/steady_timer.hpp>
#include <cmath>

namespace starling::net {
namespace {

// State of one attempt, shared by its handlers.
struct Attempt : std::enable_shared_from_this<Attempt> {
  Attempt(asio::io_context& io, std::shared_ptr<asio::ssl::context> c, ClientOptions o,
          ConnectHandler d)
      : ctx(std::move(c)),
        options(std::move(o)),
        done(std::move(d)),
        resolver(io),
        timer(io),
        stream(std::make_unique<SslStream>(io, *ctx)),
        peer(options.host + ":" + std::to_string(options.port)) {}

  void finish(Result<std::shared_ptr<Connection>> r) {
    finished = true;
    timer.cancel();
    if (!r.ok()) {
      asio::error_code ignored;
      stream->lowest_layer().close(ignored);
    }
    if (auto d = std::move(done)) d(std::move(r));
  }

  // Arms the deadline of the current step; on expiry the socket closes, failing the step.
  void arm(Millis limit, const char* step) {
    timer.expires_after(limit);
    timer.async_wait([self = shared_from_this(), limit, step](const asio::error_code& ec) {
      if (ec || self->finished) return;  // an expired timer cannot be cancelled
      self->timed_out =
          deadline_exceeded(std::string(step) + " " + self->peer + " not done after " +
                            std::to_string(limit.count()) + " ms");
      asio::error_code ignored;
      self->resolver.cancel();
      self->stream->lowest_layer().close(ignored);
    });
  }

  void start() {
    arm(options.connection.deadlines.connect, "connect to");
    resolver.async_resolve(
        options.host, std::to_string(options.port),
        [self = shared_from_this()](const asio::error_code& ec,
                                    asio::ip::tcp::resolver::results_type results) {
          if (!self->timed_out.ok()) return self->finish(self->timed_out);
          if (ec) return self->finish(net_error("resolve", self->peer, ec));
          asio::async_connect(self->stream->lowest_layer(), results,
                              [self](const asio::error_code& e, const asio::ip::tcp::endpoint&) {
                                self->on_connected(e);
                              });
        });
  }

  void on_connected(const asio::error_code& ec) {
    if (!timed_out.ok()) return finish(timed_out);
    if (ec) return finish(net_error("connect to", peer, ec));
    asio::error_code ignored;
    stream->lowest_layer().set_option(asio::ip::tcp::no_delay(true), ignored);
    const std::string& name = options.server_name.empty() ? options.host : options.server_name;
    SSL* ssl = stream->native_handle();
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
    asio::error_code not_ip;
    asio::ip::make_address(name, not_ip);
    bool ok = true;
    if (!not_ip) {
      ok = X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str()) == 1;
    } else {
      X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
      ok = X509_VERIFY_PARAM_set1_host(param, name.c_str(), name.size()) == 1 &&
           SSL_set_tlsext_host_name(ssl, name.c_str()) == 1;
    }
    if (!ok) return finish(invalid_argument("bad server name '" + name + "'"));
    arm(options.connection.deadlines.handshake, "TLS handshake with");
    stream->async_handshake(
        asio::ssl::stream_base::client,
        [self = shared_from_this()](const asio::error_code& e) { self->on_handshake(e); });
  }

  void on_handshake(const asio::error_code& ec) {
    if (!timed_out.ok()) return finish(timed_out);
    if (ec) return finish(net_error("TLS handshake with", peer, ec, stream->native_handle()));
    asio::error_code e;
    const auto remote = stream->lowest_layer().remote_endpoint(e);
    const std::string address =
        e ? peer : remote.address().to_string() + ":" + std::to_string(remote.port());
    auto identity = peer_identity(stream->native_handle(), address);
    if (!identity.ok()) return finish(identity.status());
    finish(
        std::make_shared<Connection>(std::move(stream), std::move(*identity), options.connection));
  }

  std::shared_ptr<asio::ssl::context> ctx;
  ClientOptions options;
  ConnectHandler done;
  asio::ip::tcp::resolver resolver;
  asio::steady_timer timer;
  std::unique_ptr<SslStream> stream;
  std::string peer;
  Status timed_out;
  bool finished = false;
};

struct Retry : std::enable_shared_from_this<Retry> {
  Retry(asio::io_context& i, std::shared_ptr<asio::ssl::context> c, ClientOptions o,
        BackoffOptions b, Rng rng, ConnectHandler d)
      : io(i),
        ctx(std::move(c)),
        options(std::move(o)),
        backoff(b, rng),
        max_attempts(b.max_attempts),
        done(std::move(d)),
        timer(i) {}

  void attempt() {
    ++attempts;
    connect(io, ctx, options, [self = shared_from_this()](Result<std::shared_ptr<Connection>> r) {
      const bool transient = !r.ok() && (r.status().code() == StatusCode::kUnavailable ||
                                         r.status().code() == StatusCode::kDeadlineExceeded);
      if (r.ok() || !transient ||
          (self->max_attempts > 0 && self->attempts >= self->max_attempts)) {
        if (!r.ok()) {
          return self->done(
              r.status().with_context("after " + std::to_string(self->attempts) + " attempts"));
        }
        return self->done(std::move(r));
      }
      self->timer.expires_after(self->backoff.next());
      self->timer.async_wait([self](const asio::error_code& ec) {
        if (ec) return self->done(Status(StatusCode::kCancelled, "reconnect cancelled"));
        self->attempt();
      });
    });
  }

  asio::io_context& io;
  std::shared_ptr<asio::ssl::context> ctx;
  ClientOptions options;
  Backoff backoff;
  int max_attempts;
  int attempts = 0;
  ConnectHandler done;
  asio::steady_timer timer;
};

}  // namespace

void connect(asio::io_context& io, std::shared_ptr<asio::ssl::context> ctx, ClientOptions options,
             ConnectHandler done) {
  std::make_shared<Attempt>(io, std::move(ctx), std::move(options), std::move(done))->start();
}

Millis Backoff::next() {
  const double base = static_cast<double>(options_.initial.count()) *
                      std::pow(options_.multiplier, std::min(attempt_, 62));
  ++attempt_;
  const double capped = std::min(base, static_cast<double>(options_.max.count()));
  const double factor = 1.0 + options_.jitter * (2.0 * rng_.uniform() - 1.0);
  return Millis(static_cast<int64_t>(std::max(0.0, capped * factor)));
}

void connect_with_retry(asio::io_context& io, std::shared_ptr<asio::ssl::context> ctx,
                        ClientOptions options, BackoffOptions backoff, Rng rng,
                        ConnectHandler done) {
  std::make_shared<Retry>(io, std::move(ctx), std::move(options), backoff, rng, std::move(done))
      ->attempt();
}

}  // namespace starling::net
