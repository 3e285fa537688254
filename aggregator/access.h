// Who may join a federation, kept current while the aggregator runs: the allow-list of
// [server] allowed_clients / allowed_clients_file and the revocation list of [tls] crl, reloaded
// on SIGHUP and when either file changes (checked every second). A reload replaces the TLS trust
// store (new handshakes with a revoked certificate fail) and the aggregator's AccessPolicy (open
// sessions that it now refuses are closed at once).
#pragma once

#include <asio/io_context.hpp>
#include <asio/ssl/context.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "aggregator/aggregator.h"
#include "core/net/reload_watch.h"
#include "core/net/tls.h"
#include "core/util/status.h"
#include "core/wire/federation.pb.h"

namespace starling::aggregator {

// Names from an allow-list file: one a line, blanks and '#' comments ignored. InvalidArgument
// naming file:line for a name with spaces or control characters.
Result<std::vector<std::string>> read_allow_list(const std::string& path);

// The policy a config describes now: the allow-list (list + file) and the serials `crl_pem`
// lists. The CRL must be signed by a CA of `ca_pem` (else InvalidArgument): a forged list could
// not admit anyone, but it is refused all the same.
Result<AccessPolicy> access_policy(const v1::FederationConfig& cfg, const std::string& ca_pem,
                                   const std::string& crl_pem);

class AccessWatcher {
 public:
  using Apply = std::function<void(AccessPolicy)>;
  // Loads the policy and applies it once, then watches (net::ReloadWatch). `tls` is the
  // server's TLS config (its CRL is read again on reload); `ctx` gets the new trust store.
  static Result<std::unique_ptr<AccessWatcher>> start(asio::io_context& io,
                                                      const v1::FederationConfig& cfg,
                                                      net::TlsConfig tls,
                                                      std::shared_ptr<asio::ssl::context> ctx,
                                                      Apply apply);
  // Reloads now (what SIGHUP and a file change do). On error (a CRL half written, a bad name)
  // the previous policy stays in force and the error names the file.
  Status reload();
  uint64_t reloads() const { return reloads_; }

 private:
  AccessWatcher(v1::FederationConfig cfg, net::TlsConfig tls,
                std::shared_ptr<asio::ssl::context> ctx, Apply apply)
      : cfg_(std::move(cfg)),
        tls_(std::move(tls)),
        ctx_(std::move(ctx)),
        apply_(std::move(apply)) {}

  v1::FederationConfig cfg_;
  net::TlsConfig tls_;
  std::shared_ptr<asio::ssl::context> ctx_;
  Apply apply_;
  uint64_t reloads_ = 0;
  std::unique_ptr<net::ReloadWatch> watch_;
};

}  // namespace starling::aggregator
