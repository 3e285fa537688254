// The allow-list and the revocation list of a running aggregator.
#include "aggregator/access.h"

#include <spdlog/spdlog.h>

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
    ASSIGN_OR_RETURN(auto serials, net::verified_crl_serials(crl_pem, ca_pem,
                                                             "revocation list " + cfg.tls().crl()));
    p.revoked.insert(serials.begin(), serials.end());
  }
  return p;
}

Result<std::unique_ptr<AccessWatcher>> AccessWatcher::start(asio::io_context& io,
                                                            const v1::FederationConfig& cfg,
                                                            net::TlsConfig tls,
                                                            std::shared_ptr<asio::ssl::context> ctx,
                                                            Apply apply) {
  std::unique_ptr<AccessWatcher> w(
      new AccessWatcher(cfg, std::move(tls), std::move(ctx), std::move(apply)));
  ASSIGN_OR_RETURN(AccessPolicy policy, access_policy(w->cfg_, w->tls_.ca_pem, w->tls_.crl_pem));
  w->apply_(std::move(policy));
  w->watch_ = std::make_unique<net::ReloadWatch>(
      io, "aggregator access",
      std::vector<std::string>{cfg.tls().crl(), cfg.server().allowed_clients_file()},
      [self = w.get()](const std::string&) { return self->reload(); });
  return w;
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

}  // namespace starling::aggregator
