// The allow-list and the revocation list of a running aggregator.
#include "aggregator/access.h"

#include <openssl/x509.h>
#include <spdlog/spdlog.h>

#include <csignal>
#include <fstream>

#include "core/net/certs.h"

namespace starling::aggregator {

Result<std::vector<std::string>> read_allow_list(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found("allow-list " + path + ": cannot open");
  std::vector<std::string> names;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    const size_t b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos) continue;
    const size_t e = line.find_last_not_of(" \t\r");
    std::string name = line.substr(b, e - b + 1);
    for (unsigned char c : name) {
      if (c < 0x20 || c == ' ' || c == 0x7f) {
        return invalid_argument(path + ":" + std::to_string(n) + ": '" + name +
                                "' is not a certificate name (one name a line, no spaces)");
      }
    }
    names.push_back(std::move(name));
  }
  return names;
}

Result<AccessPolicy> access_policy(const v1::FederationConfig& cfg, const std::string& ca_pem,
                                   const std::string& crl_pem) {
  AccessPolicy p;
  p.restricted =
      cfg.server().allowed_clients_size() > 0 || !cfg.server().allowed_clients_file().empty();
  for (const auto& name : cfg.server().allowed_clients()) p.allowed.insert(name);
  if (!cfg.server().allowed_clients_file().empty()) {
    ASSIGN_OR_RETURN(auto names, read_allow_list(cfg.server().allowed_clients_file()));
    p.allowed.insert(names.begin(), names.end());
  }
  if (!crl_pem.empty()) {
    const std::string where = "revocation list " + cfg.tls().crl();
    ASSIGN_OR_RETURN(net::X509CrlPtr crl, net::crl_from_pem(crl_pem), where);
    ASSIGN_OR_RETURN(auto cas, net::certs_from_pem(ca_pem), "CA certificate");
    bool signed_by_ca = false;
    for (const auto& ca : cas) {
      if (X509_CRL_verify(crl.get(), X509_get0_pubkey(ca.get())) == 1) signed_by_ca = true;
    }
    net::drain_openssl_errors();
    if (!signed_by_ca) return invalid_argument(where + " is not signed by the federation CA");
    for (auto& serial : net::crl_serials(crl.get())) p.revoked.insert(std::move(serial));
  }
  return p;
}

AccessWatcher::AccessWatcher(asio::io_context& io, v1::FederationConfig cfg, net::TlsConfig tls,
                             std::shared_ptr<asio::ssl::context> ctx, Apply apply)
    : cfg_(std::move(cfg)),
      tls_(std::move(tls)),
      ctx_(std::move(ctx)),
      apply_(std::move(apply)),
      hup_(io, SIGHUP),
      timer_(io) {
  for (const std::string& path : {cfg_.tls().crl(), cfg_.server().allowed_clients_file()}) {
    if (!path.empty()) files_.emplace_back(path, stamp_of(path));
  }
}

AccessWatcher::~AccessWatcher() {
  *alive_ = false;
  asio::error_code ignored;
  hup_.cancel(ignored);
  timer_.cancel();
}

Result<std::unique_ptr<AccessWatcher>> AccessWatcher::start(asio::io_context& io,
                                                            const v1::FederationConfig& cfg,
                                                            net::TlsConfig tls,
                                                            std::shared_ptr<asio::ssl::context> ctx,
                                                            Apply apply) {
  std::unique_ptr<AccessWatcher> w(
      new AccessWatcher(io, cfg, std::move(tls), std::move(ctx), std::move(apply)));
  ASSIGN_OR_RETURN(AccessPolicy policy, access_policy(w->cfg_, w->tls_.ca_pem, w->tls_.crl_pem));
  w->apply_(std::move(policy));
  w->watch_signal();
  w->poll();
  return w;
}

AccessWatcher::Stamp AccessWatcher::stamp_of(const std::string& path) {
  std::error_code ec;
  Stamp s;
  s.mtime = std::filesystem::last_write_time(path, ec);
  if (ec) return s;
  s.size = std::filesystem::file_size(path, ec);
  s.exists = !ec;
  return s;
}

Status AccessWatcher::reload() {
  net::TlsConfig next = tls_;
  if (!cfg_.tls().crl().empty()) {
    ASSIGN_OR_RETURN(next.crl_pem, net::read_file(cfg_.tls().crl()), "revocation list");
  }
  ASSIGN_OR_RETURN(AccessPolicy policy, access_policy(cfg_, next.ca_pem, next.crl_pem));
  RETURN_IF_ERROR(net::reload_trust(*ctx_, next));
  tls_ = std::move(next);
  ++reloads_;
  spdlog::info("aggregator: access reloaded: {} revoked certificate(s), {}", policy.revoked.size(),
               policy.restricted ? std::to_string(policy.allowed.size()) + " allowed client(s)"
                                 : std::string("any client of the CA"));
  apply_(std::move(policy));
  return ok_status();
}

void AccessWatcher::watch_signal() {
  hup_.async_wait([this, alive = alive_](const asio::error_code& ec, int) {
    if (ec || !*alive) return;
    spdlog::info("aggregator: SIGHUP: reloading the allow-list and the revocation list");
    if (const Status st = reload(); !st.ok()) {
      spdlog::error("aggregator: reload refused, the previous access policy stays: {}",
                    st.to_string());
    }
    watch_signal();
  });
}

void AccessWatcher::poll() {
  timer_.expires_after(std::chrono::seconds(1));
  timer_.async_wait([this, alive = alive_](const asio::error_code& ec) {
    if (ec || !*alive) return;
    bool changed = false;
    for (auto& [path, stamp] : files_) {
      const Stamp now = stamp_of(path);
      if (!(now == stamp)) {
        stamp = now;
        changed = true;
      }
    }
    if (changed) {
      if (const Status st = reload(); !st.ok()) {
        spdlog::error("aggregator: reload refused, the previous access policy stays: {}",
                      st.to_string());
      }
    }
    poll();
  });
}

}  // namespace starling::aggregator
