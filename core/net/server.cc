// Server: accept loop and handshakes. Impl is shared with pending handlers so that destroying
// the Server while a handshake runs is safe.
#include "core/net/server.h"

#include <algorithm>
#include <asio/ip/address.hpp>
#include <asio/ssl/error.hpp>

namespace starling::net {

struct Server::Impl : std::enable_shared_from_this<Server::Impl> {
  Impl(asio::io_context& io, std::shared_ptr<asio::ssl::context> c, ServerOptions o,
       AcceptHandler a, RejectHandler r)
      : ctx(std::move(c)),
        options(std::move(o)),
        acceptor(io),
        retry_timer(io),
        on_accept(std::move(a)),
        on_reject(std::move(r)) {}

  void accept_next();
  void handshake(asio::ip::tcp::socket socket);
  void reject(const Status& s) {
    if (on_reject) on_reject(s);
  }

  std::shared_ptr<asio::ssl::context> ctx;
  ServerOptions options;
  asio::ip::tcp::acceptor acceptor;
  asio::steady_timer retry_timer;
  std::string where;  // listening address, for messages
  AcceptHandler on_accept;
  RejectHandler on_reject;
  size_t connections = 0;
  size_t handshaking = 0;
  bool accept_paused = false;  // at max_handshakes: accept_next() once one finishes
  bool stopped = false;
};

void Server::Impl::accept_next() {
  acceptor.async_accept(
      [self = shared_from_this()](const asio::error_code& ec, asio::ip::tcp::socket socket) {
        if (self->stopped) return;
        if (ec) {
          // Out of descriptors and similar: report, and accept again after a pause rather
          // than spinning on an error that repeats at once.
          self->reject(net_error("accept on", self->where, ec));
          self->retry_timer.expires_after(std::chrono::milliseconds(100));
          self->retry_timer.async_wait([self](const asio::error_code& e) {
            if (!e && !self->stopped) self->accept_next();
          });
          return;
        } else if (self->connections >= self->options.max_connections) {
          asio::error_code ignored;
          const auto remote = socket.remote_endpoint(ignored);
          socket.close(ignored);
          self->reject(resource_exhausted("connection limit of " +
                                          std::to_string(self->options.max_connections) +
                                          " reached; refused " + remote.address().to_string() +
                                          ":" + std::to_string(remote.port())));
        } else {
          self->handshake(std::move(socket));
        }
        if (self->handshaking >= std::max<size_t>(self->options.max_handshakes, 1)) {
          self->accept_paused = true;
          return;
        }
        self->accept_next();
      });
}

void Server::Impl::handshake(asio::ip::tcp::socket socket) {
  asio::error_code ec;
  const auto remote = socket.remote_endpoint(ec);
  std::string address = ec ? std::string("unknown peer")
                           : remote.address().to_string() + ":" + std::to_string(remote.port());
  auto stream = std::make_unique<SslStream>(std::move(socket), *ctx);
  auto timer = std::make_shared<asio::steady_timer>(acceptor.get_executor());
  // Both handlers run on this thread; the flags tell each whether the other already ran (a
  // timer that has fired cannot be cancelled, and the stream may be gone by then).
  struct Flags {
    bool done = false;
    bool timed_out = false;
  };
  auto flags = std::make_shared<Flags>();
  ++connections;
  ++handshaking;
  SslStream* raw = stream.get();
  timer->expires_after(options.connection.deadlines.handshake);
  timer->async_wait([raw, flags](const asio::error_code& e) {
    if (e || flags->done) return;
    flags->timed_out = true;
    asio::error_code ignored;
    raw->lowest_layer().close(ignored);  // completes the handshake with an error
  });
  raw->async_handshake(
      asio::ssl::stream_base::server,
      [self = shared_from_this(), stream = std::move(stream), timer, flags,
       address = std::move(address)](const asio::error_code& e) mutable {
        flags->done = true;
        timer->cancel();
        --self->handshaking;
        if (self->accept_paused && !self->stopped) {
          self->accept_paused = false;
          self->accept_next();
        }
        Status s;
        if (flags->timed_out) {
          s = deadline_exceeded(
              "TLS handshake with " + address + " not done after " +
              std::to_string(self->options.connection.deadlines.handshake.count()) + " ms");
        } else if (e) {
          s = net_error("TLS handshake with", address, e, stream->native_handle());
        } else if (self->stopped) {
          s = {StatusCode::kCancelled, "server stopped"};
        }
        Result<PeerIdentity> peer =
            s.ok() ? peer_identity(stream->native_handle(), address) : Result<PeerIdentity>(s);
        if (!peer.ok()) {
          --self->connections;
          asio::error_code ignored;
          stream->lowest_layer().close(ignored);
          self->reject(peer.status());
          return;
        }
        auto conn = std::make_shared<Connection>(std::move(stream), std::move(*peer),
                                                 self->options.connection);
        conn->set_teardown_hook([weak = std::weak_ptr<Impl>(self)] {
          if (auto impl = weak.lock()) --impl->connections;
        });
        if (self->on_accept) {
          self->on_accept(std::move(conn));
        } else {
          conn->close();
        }
      });
}

Result<std::unique_ptr<Server>> Server::listen(asio::io_context& io,
                                               std::shared_ptr<asio::ssl::context> ctx,
                                               ServerOptions options, AcceptHandler on_accept,
                                               RejectHandler on_reject) {
  asio::error_code ec;
  const auto address = asio::ip::make_address(options.host, ec);
  if (ec) return invalid_argument("listen address '" + options.host + "': " + ec.message());
  const asio::ip::tcp::endpoint endpoint(address, options.port);
  auto impl = std::make_shared<Impl>(io, std::move(ctx), std::move(options), std::move(on_accept),
                                     std::move(on_reject));
  const std::string where = endpoint.address().to_string() + ":" + std::to_string(endpoint.port());
  impl->where = where;
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return net_error("listen on", where, ec);
  impl->accept_next();
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::~Server() { stop(); }

uint16_t Server::port() const {
  asio::error_code ec;
  const auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

size_t Server::connection_count() const { return impl_->connections; }

void Server::stop() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  asio::error_code ignored;
  impl_->acceptor.close(ignored);
  impl_->retry_timer.cancel();
}

}  // namespace starling::net
