// SIGHUP and file-change reloads.
#include "core/net/reload_watch.h"

#include <openssl/x509.h>
#include <spdlog/spdlog.h>

#include <csignal>

#include "core/net/certs.h"

namespace starling::net {

ReloadWatch::ReloadWatch(asio::io_context& io, std::string what, std::vector<std::string> files,
                         Reload reload, std::chrono::milliseconds period)
    : what_(std::move(what)),
      reload_(std::move(reload)),
      period_(period),
      hup_(io, SIGHUP),
      timer_(io) {
  for (auto& path : files) {
    if (!path.empty()) files_.emplace_back(path, stamp_of(path));
  }
  watch_signal();
  if (!files_.empty()) poll();
}

ReloadWatch::~ReloadWatch() {
  *alive_ = false;
  asio::error_code ignored;
  hup_.cancel(ignored);
  timer_.cancel();
}

ReloadWatch::Stamp ReloadWatch::stamp_of(const std::string& path) {
  std::error_code ec;
  Stamp s;
  s.mtime = std::filesystem::last_write_time(path, ec);
  if (ec) return s;
  s.size = std::filesystem::file_size(path, ec);
  s.exists = !ec;
  return s;
}

void ReloadWatch::run(const std::string& why) {
  spdlog::info("{}: {}: reloading", what_, why);
  if (const Status st = reload_(why); !st.ok()) {
    spdlog::error("{}: reload refused, the previous settings stay: {}", what_, st.to_string());
  }
}

void ReloadWatch::watch_signal() {
  hup_.async_wait([this, alive = alive_](const asio::error_code& ec, int) {
    if (ec || !*alive) return;
    run("SIGHUP");
    watch_signal();
  });
}

void ReloadWatch::poll() {
  timer_.expires_after(period_);
  timer_.async_wait([this, alive = alive_](const asio::error_code& ec) {
    if (ec || !*alive) return;
    std::string changed;
    for (auto& [path, stamp] : files_) {
      const Stamp now = stamp_of(path);
      if (!(now == stamp)) {
        stamp = now;
        if (changed.empty()) changed = path + " changed";
      }
    }
    if (!changed.empty()) run(changed);
    poll();
  });
}

Result<std::vector<std::string>> verified_crl_serials(const std::string& crl_pem,
                                                      const std::string& ca_pem,
                                                      const std::string& where) {
  ASSIGN_OR_RETURN(X509CrlPtr crl, crl_from_pem(crl_pem), where);
  ASSIGN_OR_RETURN(auto cas, certs_from_pem(ca_pem), "CA certificate");
  bool signed_by_ca = false;
  for (const auto& ca : cas) {
    if (X509_CRL_verify(crl.get(), X509_get0_pubkey(ca.get())) == 1) signed_by_ca = true;
  }
  drain_openssl_errors();
  if (!signed_by_ca) return invalid_argument(where + " is not signed by the federation CA");
  return crl_serials(crl.get());
}

}  // namespace starling::net
