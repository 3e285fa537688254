// TLS 1.3 contexts for federation nodes (Asio + OpenSSL): trust only the federation CA,
// present this node's certificate, require the peer's, optionally check a CRL. Also the
// node identity read from a verified peer certificate, and the one mapping of errors to Status.
#pragma once

#include <openssl/ssl.h>

#include <asio/error_code.hpp>
#include <asio/ssl/context.hpp>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/util/status.h"

namespace starling::net {

struct TlsConfig {
  std::string ca_pem;    // trust anchors: the federation CA (a bundle is allowed)
  std::string cert_pem;  // this node's certificate, leaf first
  std::string key_pem;   // its private key
  std::string crl_pem;   // optional revocation list of the CA; "" for none
  // Server side: refuse clients without a valid certificate. Turning this off is for tests
  // and public read-only endpoints only.
  bool require_peer_cert = true;
};

// Reads the PEM files (crl_path may be "").
Result<TlsConfig> load_tls_config(const std::string& ca_path, const std::string& cert_path,
                                  const std::string& key_path, const std::string& crl_path = "");

enum class TlsSide { kServer, kClient };

// A context that speaks TLS 1.3 only and verifies peers against config.ca_pem. Fails when the
// key does not match the certificate or any PEM is malformed.
Result<std::shared_ptr<asio::ssl::context>> make_tls_context(const TlsConfig& config, TlsSide side);

// Replaces the trust store of `ctx` with one built from config.ca_pem and config.crl_pem (the
// other fields are not read): handshakes from now on verify against it, so a certificate the
// new CRL lists is refused. Connections already open are not touched; their owners close the
// revoked ones. Call on the thread that runs the context's handshakes.
Status reload_trust(asio::ssl::context& ctx, const TlsConfig& config);

// Who is on the other end of a verified connection.
struct PeerIdentity {
  std::string node_id;  // certificate CN
  std::string role;     // certificate OU: server, client or peer
  std::vector<std::string> dns_names;
  std::vector<std::string> ip_addresses;
  std::string address;  // ip:port of the socket
  std::string serial;   // certificate serial, upper-case hex (cert_serial_hex)
  // "node_id (address)", or the address alone before the handshake.
  std::string describe() const;
};

// Identity from the peer certificate of a completed handshake. Unauthenticated when none.
Result<PeerIdentity> peer_identity(SSL* ssl, std::string address);

// The Status for a failed network step: "<step> <peer>: <reason>", with the certificate
// verification reason when OpenSSL rejected the peer's certificate (and the subject CN of the
// certificate it rejected: "certificate revoked, CN=client-3"). Codes: TLS failures are
// Unauthenticated, timeouts DeadlineExceeded, resets and refusals Unavailable.
Status net_error(std::string_view step, std::string_view peer, const asio::error_code& ec,
                 SSL* ssl = nullptr);

}  // namespace starling::net
