// ReloadWatch: calls a reload function on SIGHUP and whenever one of a few files changes (size
// or modification time, polled every second), on the io_context's thread. The aggregator uses
// it for its allow-list and CRL, gossip peers for their CRL.
#pragma once

#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/util/status.h"

namespace starling::net {

class ReloadWatch {
 public:
  // `reload(why)`: why is "SIGHUP" or the path that changed. Its error is logged as
  // "<what>: reload refused, the previous settings stay: ..." (the callee keeps its state).
  using Reload = std::function<Status(const std::string& why)>;
  ReloadWatch(asio::io_context& io, std::string what, std::vector<std::string> files, Reload reload,
              std::chrono::milliseconds period = std::chrono::seconds(1));
  ~ReloadWatch();
  ReloadWatch(const ReloadWatch&) = delete;
  ReloadWatch& operator=(const ReloadWatch&) = delete;

 private:
  struct Stamp {
    bool exists = false;
    std::filesystem::file_time_type mtime{};
    uintmax_t size = 0;
    bool operator==(const Stamp&) const = default;
  };
  static Stamp stamp_of(const std::string& path);
  void run(const std::string& why);
  void watch_signal();
  void poll();

  std::string what_;
  Reload reload_;
  std::chrono::milliseconds period_;
  asio::signal_set hup_;
  asio::steady_timer timer_;
  std::vector<std::pair<std::string, Stamp>> files_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

// The serial numbers a CRL file lists, after checking that a CA of `ca_pem` signed it
// (InvalidArgument naming the file otherwise).
Result<std::vector<std::string>> verified_crl_serials(const std::string& crl_pem,
                                                      const std::string& ca_pem,
                                                      const std::string& where);

}  // namespace starling::net
