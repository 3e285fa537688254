// TLS context setup and error translation.
#include "core/net/tls.h"

#include <openssl/err.h>
#include <openssl/x509_vfy.h>

#include <asio/error.hpp>
#include <asio/ssl/error.hpp>

#include "core/net/certs.h"

namespace starling::net {
namespace {

Status tls_setup_error(std::string_view what) {
  std::string m(what);
  const std::string detail = drain_openssl_errors();
  if (!detail.empty()) m += ": " + detail;
  return invalid_argument(std::move(m));
}

// The CN of the certificate a failed verification rejected, kept on the SSL object so that
// the error message can name who was refused (OpenSSL stores no peer certificate then).
int rejected_cn_index() {
  static const int index = SSL_get_ex_new_index(
      0, nullptr, nullptr, nullptr, [](void*, void* ptr, CRYPTO_EX_DATA*, int, long, void*) {
        delete static_cast<std::string*>(ptr);
      });
  return index;
}

int verify_callback(int ok, X509_STORE_CTX* store) {
  if (ok) return ok;
  auto* ssl =
      static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  X509* cert = X509_STORE_CTX_get_current_cert(store);
  if (ssl != nullptr && cert != nullptr && SSL_get_ex_data(ssl, rejected_cn_index()) == nullptr) {
    const std::string cn = cert_identity(cert).common_name;
    if (!cn.empty()) SSL_set_ex_data(ssl, rejected_cn_index(), new std::string(cn));
  }
  return ok;
}

// A store trusting config.ca_pem, checking config.crl_pem when given.
Result<X509_STORE*> make_store(const TlsConfig& config, std::vector<X509Ptr>* cas_out) {
  ASSIGN_OR_RETURN(auto cas, certs_from_pem(config.ca_pem), "CA certificate");
  std::unique_ptr<X509_STORE, decltype(&X509_STORE_free)> store(X509_STORE_new(), &X509_STORE_free);
  if (!store) return tls_setup_error("X509_STORE_new");
  for (auto& ca : cas) {
    if (X509_STORE_add_cert(store.get(), ca.get()) != 1) return tls_setup_error("adding the CA");
  }
  if (!config.crl_pem.empty()) {
    ASSIGN_OR_RETURN(X509CrlPtr crl, crl_from_pem(config.crl_pem), "revocation list");
    if (X509_STORE_add_crl(store.get(), crl.get()) != 1 ||
        X509_STORE_set_flags(store.get(), X509_V_FLAG_CRL_CHECK) != 1) {
      return tls_setup_error("adding the revocation list");
    }
  }
  if (cas_out != nullptr) *cas_out = std::move(cas);
  return store.release();
}

}  // namespace

Status reload_trust(asio::ssl::context& ctx, const TlsConfig& config) {
  ASSIGN_OR_RETURN(X509_STORE * store, make_store(config, nullptr), "reloading trust");
  SSL_CTX_set_cert_store(ctx.native_handle(), store);  // frees the old store
  return ok_status();
}

Result<TlsConfig> load_tls_config(const std::string& ca_path, const std::string& cert_path,
                                  const std::string& key_path, const std::string& crl_path) {
  TlsConfig c;
  ASSIGN_OR_RETURN(c.ca_pem, read_file(ca_path), "CA certificate");
  ASSIGN_OR_RETURN(c.cert_pem, read_file(cert_path), "certificate");
  ASSIGN_OR_RETURN(c.key_pem, read_file(key_path), "private key");
  if (!crl_path.empty()) {
    ASSIGN_OR_RETURN(c.crl_pem, read_file(crl_path), "revocation list");
  }
  return c;
}

Result<std::shared_ptr<asio::ssl::context>> make_tls_context(const TlsConfig& config,
                                                             TlsSide side) {
  auto ctx = std::make_shared<asio::ssl::context>(
      side == TlsSide::kServer ? asio::ssl::context::tls_server : asio::ssl::context::tls_client);
  SSL_CTX* c = ctx->native_handle();
  if (SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION) != 1) {
    return tls_setup_error("cannot require TLS 1.3");
  }
  // No session tickets: nodes keep long connections, and unread tickets would turn a client's
  // close into a reset.
  SSL_CTX_set_options(c, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION | SSL_OP_NO_TICKET);
  SSL_CTX_set_num_tickets(c, 0);
  // OpenSSL frees a connection's record buffers (about 34 KiB) while no record is in flight.
  SSL_CTX_set_mode(c, SSL_MODE_RELEASE_BUFFERS);

  std::vector<X509Ptr> cas;
  ASSIGN_OR_RETURN(X509_STORE * store, make_store(config, &cas));
  SSL_CTX_set_cert_store(c, store);
  for (auto& ca : cas) {
    // Named in the certificate request, so a client holding several certificates picks ours.
    if (side == TlsSide::kServer && SSL_CTX_add_client_CA(c, ca.get()) != 1) {
      return tls_setup_error("naming the CA in certificate requests");
    }
  }

  ASSIGN_OR_RETURN(auto chain, certs_from_pem(config.cert_pem), "certificate");
  if (SSL_CTX_use_certificate(c, chain[0].get()) != 1) return tls_setup_error("certificate");
  for (size_t i = 1; i < chain.size(); ++i) {
    if (SSL_CTX_add1_chain_cert(c, chain[i].get()) != 1) return tls_setup_error("chain");
  }
  ASSIGN_OR_RETURN(PkeyPtr key, key_from_pem(config.key_pem), "private key");
  if (SSL_CTX_use_PrivateKey(c, key.get()) != 1 || SSL_CTX_check_private_key(c) != 1) {
    return tls_setup_error("private key does not match the certificate");
  }

  int mode = SSL_VERIFY_PEER;
  if (side == TlsSide::kServer && config.require_peer_cert) mode |= SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
  SSL_CTX_set_verify(c, mode, verify_callback);
  SSL_CTX_set_verify_depth(c, 4);
  return ctx;
}

std::string PeerIdentity::describe() const {
  if (node_id.empty()) return address;
  return node_id + " (" + address + ")";
}

Result<PeerIdentity> peer_identity(SSL* ssl, std::string address) {
  X509Ptr cert(SSL_get1_peer_certificate(ssl));
  if (!cert) return unauthenticated("peer " + address + " presented no certificate");
  if (SSL_get_verify_result(ssl) != X509_V_OK) {
    return unauthenticated("certificate of " + address + " is not verified");
  }
  CertIdentity id = cert_identity(cert.get());
  if (id.common_name.empty()) {
    return unauthenticated("certificate of " + address + " has no common name");
  }
  PeerIdentity peer;
  peer.node_id = std::move(id.common_name);
  peer.role = std::move(id.role);
  peer.serial = cert_serial_hex(cert.get());
  peer.dns_names = std::move(id.dns_names);
  peer.ip_addresses = std::move(id.ip_addresses);
  peer.address = std::move(address);
  return peer;
}

Status net_error(std::string_view step, std::string_view peer, const asio::error_code& ec,
                 SSL* ssl) {
  std::string m(step);
  m += " ";
  m += peer;
  m += ": ";
  if (ec.category() == asio::error::get_ssl_category()) {
    m += ERR_reason_error_string(static_cast<unsigned long>(ec.value())) != nullptr
             ? ERR_reason_error_string(static_cast<unsigned long>(ec.value()))
             : ec.message();
    const long verify = ssl != nullptr ? SSL_get_verify_result(ssl) : X509_V_OK;
    if (verify != X509_V_OK) {
      m += " (";
      m += X509_verify_cert_error_string(verify);
      if (const auto* cn = static_cast<const std::string*>(
              ssl != nullptr ? SSL_get_ex_data(ssl, rejected_cn_index()) : nullptr)) {
        m += ", CN=" + *cn;
      }
      m += ")";
    }
    const int reason = ERR_GET_REASON(static_cast<unsigned long>(ec.value()));
    if (reason == SSL_R_WRONG_VERSION_NUMBER || reason == SSL_R_HTTP_REQUEST ||
        reason == SSL_R_UNSUPPORTED_PROTOCOL) {
      m += " (the peer does not speak TLS 1.3)";
    }
    ERR_clear_error();
    return unauthenticated(std::move(m));
  }
  if (ec == asio::ssl::error::stream_truncated) {
    return unavailable(m + "connection closed without TLS close_notify");
  }
  m += ec.message();
  if (ec == asio::error::timed_out) return deadline_exceeded(std::move(m));
  if (ec == asio::error::operation_aborted) return {StatusCode::kCancelled, std::move(m)};
  return unavailable(std::move(m));
}

}  // namespace starling::net
