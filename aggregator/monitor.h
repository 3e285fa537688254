// Observability of the aggregator: Prometheus metrics (prometheus-cpp's registry and text
// format) and an HTML status page (round, clients, bytes, loss and accuracy over rounds as an
// inline SVG chart), served over plain HTTP on the aggregator's own io_context.
#pragma once

#include <asio/io_context.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/util/status.h"

namespace starling::aggregator {

struct RoundReport;

// Not thread-safe: every call and the HTTP handlers run on the io_context thread, so the
// aggregator feeds it without locks. The server answers GET /metrics (Prometheus text format
// 0.0.4), GET / and /status (HTML), /status.json; anything else is 404 (405 for another
// method, 400 for a malformed request). Each connection has a 5 s deadline and a 8 KiB limit on
// the request head, and is closed after one response.
// Every copy of the shared_ptr (AggregatorOptions::monitor too) must be gone before the
// io_context is destroyed: the acceptor closes into it.
class Monitor : public std::enable_shared_from_this<Monitor> {
 public:
  // Listens on host:port (port 0: any free port). `title` heads the status page.
  static Result<std::shared_ptr<Monitor>> start(asio::io_context& io, const std::string& host,
                                                uint16_t port, std::string title);
  ~Monitor();
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  uint16_t port() const;
  // Stops accepting; connections in progress finish on their own.
  void stop();

  // Events from the aggregator.
  void set_registered(size_t clients);
  void round_started(uint64_t round, int selected);
  void bytes_received(uint64_t bytes);
  void update_folded();
  void update_rejected();
  void round_closed(const RoundReport& report);
  // Secure aggregation: the round's stage began (0 advertise keys, 1 share keys, 2 masked
  // input, 3 unmask) with `clients` clients expected to answer in it. Stage -1 (or any other
  // outside 0..3): none in progress, as after an aborted round. round_closed ends the stage; so
  // does round_started for another round.
  void secagg_stage(uint64_t round, int stage, int clients);
  // A client refused by the access policy (allow-list, revocation), or a handshake the TLS
  // layer refused (`who` is then the error, which names the certificate's CN where known).
  void identity_refused(const std::string& who, const std::string& why);
  void handshake_refused(const std::string& error);
  // A client said its training lost it a round (v1::Error with ERROR_CODE_INTERNAL, retryable).
  void client_round_failed(const std::string& who, const std::string& why);
  // From whoever evaluates the global model (the `starling aggregator` round hook).
  void evaluated(uint64_t round, double loss, double accuracy);

  // The bodies the server sends.
  std::string metrics_text() const;
  std::string status_html() const;
  std::string status_json() const;

  struct Impl;

 private:
  explicit Monitor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace starling::aggregator
