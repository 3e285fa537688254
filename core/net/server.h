// Server: accepts TCP connections, runs the TLS handshake under a deadline, and hands each
// verified peer to the application as a Connection. Enforces a connection limit.
#pragma once

#include <asio/io_context.hpp>
#include <asio/ssl/context.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/net/connection.h"
#include "core/util/status.h"

namespace starling::net {

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: any free port, see Server::port()
  // Handshaking plus established connections; beyond it new sockets are closed at once.
  size_t max_connections = 1024;
  // TLS handshakes in progress at once; further connections wait in the kernel's accept queue
  // until one finishes (a handshake's key exchange and certificate state cost tens of KiB, so
  // a thousand clients connecting together would otherwise all hold it at once).
  size_t max_handshakes = 64;
  ConnectionOptions connection;
};

// Not thread-safe. REQUIRES: the io_context is run by one thread. Destroying the server stops
// accepting; established connections stay open until closed.
class Server {
 public:
  // Receives each verified connection; must call start() on it to begin reading.
  using AcceptHandler = std::function<void(std::shared_ptr<Connection>)>;
  // Receives each refused or failed connection attempt (handshake errors, limit).
  using RejectHandler = std::function<void(const Status&)>;

  // Binds and starts accepting. REQUIRES: ctx made with TlsSide::kServer.
  static Result<std::unique_ptr<Server>> listen(asio::io_context& io,
                                                std::shared_ptr<asio::ssl::context> ctx,
                                                ServerOptions options, AcceptHandler on_accept,
                                                RejectHandler on_reject);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  uint16_t port() const;
  size_t connection_count() const;
  void stop();

  struct Impl;

 private:
  explicit Server(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace starling::net
