// Certificate and connectivity checks of `starling client --check`.
#include "edge_client/preflight.h"

#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <optional>

#include "core/net/certs.h"
#include "core/net/hello.h"

namespace starling::edge_client {

Result<std::string> check_node_certificate(const net::TlsConfig& tls, std::string_view node_id) {
  ASSIGN_OR_RETURN(auto chain, net::certs_from_pem(tls.cert_pem), "node certificate");
  ASSIGN_OR_RETURN(auto cas, net::certs_from_pem(tls.ca_pem), "CA certificate");
  ASSIGN_OR_RETURN(auto key, net::key_from_pem(tls.key_pem), "node key");
  X509* leaf = chain.front().get();
  if (X509_check_private_key(leaf, key.get()) != 1) {
    net::drain_openssl_errors();
    return invalid_argument("the private key does not belong to the certificate");
  }
  std::unique_ptr<X509_STORE, decltype(&X509_STORE_free)> store(X509_STORE_new(), &X509_STORE_free);
  for (auto& ca : cas) X509_STORE_add_cert(store.get(), ca.get());
  net::X509CrlPtr crl;
  if (!tls.crl_pem.empty()) {
    ASSIGN_OR_RETURN(crl, net::crl_from_pem(tls.crl_pem), "revocation list");
    X509_STORE_add_crl(store.get(), crl.get());
    X509_STORE_set_flags(store.get(), X509_V_FLAG_CRL_CHECK);
  }
  struct StackFree {
    void operator()(STACK_OF(X509) * s) const { sk_X509_free(s); }
  };
  std::unique_ptr<STACK_OF(X509), StackFree> untrusted(sk_X509_new_null());
  for (size_t i = 1; i < chain.size(); ++i) sk_X509_push(untrusted.get(), chain[i].get());
  std::unique_ptr<X509_STORE_CTX, decltype(&X509_STORE_CTX_free)> ctx(X509_STORE_CTX_new(),
                                                                      &X509_STORE_CTX_free);
  X509_STORE_CTX_init(ctx.get(), store.get(), leaf, untrusted.get());
  X509_STORE_CTX_set_purpose(ctx.get(), X509_PURPOSE_SSL_CLIENT);
  if (X509_verify_cert(ctx.get()) != 1) {
    const int err = X509_STORE_CTX_get_error(ctx.get());
    net::drain_openssl_errors();
    return unauthenticated(std::string("the certificate does not verify against the CA: ") +
                           X509_verify_cert_error_string(err));
  }
  const auto id = net::cert_identity(leaf);
  if (!node_id.empty() && id.common_name != node_id) {
    return invalid_argument("the certificate is for '" + id.common_name + "', but this node is '" +
                            std::string(node_id) + "'");
  }
  int days = 0;
  int secs = 0;
  ASN1_TIME_diff(&days, &secs, nullptr, X509_get0_notAfter(leaf));
  std::string detail = "CN=" + id.common_name + ", role " +
                       (id.role.empty() ? std::string("(none)") : id.role) + ", expires in " +
                       std::to_string(days) + " days";
  if (days < 30) detail += " (renew it soon: `starling certs issue`)";
  return detail;
}

Result<std::string> probe_aggregator(std::shared_ptr<asio::ssl::context> ctx,
                                     net::ClientOptions options, const std::string& node_id,
                                     std::chrono::milliseconds timeout) {
  asio::io_context io;
  options.connection.deadlines.connect = timeout;
  options.connection.deadlines.handshake = timeout;
  const std::string where = options.host + ":" + std::to_string(options.port);
  std::optional<Result<std::string>> outcome;
  std::shared_ptr<net::Connection> conn;
  net::connect(io, ctx, options, [&](Result<std::shared_ptr<net::Connection>> r) {
    if (!r.ok()) {
      outcome = r.status();
      return;
    }
    conn = *r;
    conn->start(
        [&](v1::Envelope e) {
          if (outcome) return;
          if (e.body_case() == v1::Envelope::kHello) {
            const Status st = net::check_hello(e.hello(), conn->peer());
            if (!st.ok()) {
              outcome = st;
            } else if (e.hello().role() != v1::ROLE_AGGREGATOR) {
              outcome = permission_denied(where + " is not an aggregator");
            } else {
              outcome = "aggregator " + conn->peer().node_id + " at " + where;
            }
            conn->close();
          } else if (e.body_case() == v1::Envelope::kError) {
            outcome = permission_denied("the aggregator at " + where +
                                        " refused us: " + e.error().message());
            conn->close();
          }
        },
        [&](const Status& st) {
          if (!outcome) outcome = st.ok() ? unavailable(where + " closed the connection") : st;
        });
    v1::Envelope hello;
    *hello.mutable_hello() =
        net::make_hello(node_id, v1::ROLE_CLIENT, {"identity"}, wire::kDefaultMaxFrameBytes);
    (void)conn->send(hello);
  });
  const auto until = std::chrono::steady_clock::now() + timeout + timeout;
  while (!outcome && std::chrono::steady_clock::now() < until) {
    if (io.stopped()) io.restart();
    io.run_one_for(std::chrono::milliseconds(50));
  }
  if (conn) conn->abort(Status(StatusCode::kCancelled, "probe done"));
  io.poll();
  if (!outcome) return deadline_exceeded("no Hello from " + where + " within the deadline");
  return std::move(*outcome);
}

}  // namespace starling::edge_client
