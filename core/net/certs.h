// Federation certificates with OpenSSL 3: EC P-256 keys, a self-signed CA, node certificates
// (server, client or peer, with SANs), revocation lists, PEM files. Shared by `starling certs`
// and the tests, which make every certificate in memory.
#pragma once

#include <openssl/evp.h>
#include <openssl/x509.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/util/status.h"

namespace starling::net {

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct X509Free {
  void operator()(X509* p) const { X509_free(p); }
};
struct X509CrlFree {
  void operator()(X509_CRL* p) const { X509_CRL_free(p); }
};
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using X509CrlPtr = std::unique_ptr<X509_CRL, X509CrlFree>;

// Pops and joins every queued OpenSSL error of this thread ("" when none).
std::string drain_openssl_errors();

// What a certificate is for. Written into the subject's OU and the extended key usage:
// server = serverAuth, client = clientAuth, peer = both, leaf = both (a leaf aggregator of a
// tier: an aggregator to its own clients, a contributor to the tier above, aggregator/leaf.h).
enum class CertRole { kCa, kServer, kClient, kPeer, kLeaf };
std::string_view cert_role_name(CertRole role);
// "ca", "server", "client", "peer" or "leaf".
Result<CertRole> parse_cert_role(std::string_view name);

struct CertSpec {
  std::string common_name;  // the node identity (or the federation name for a CA)
  CertRole role = CertRole::kPeer;
  // Subject alternative names, each "DNS:name" or "IP:address".
  std::vector<std::string> sans;
  // Validity relative to now, in seconds; both negative makes an expired certificate.
  int64_t valid_from_s = -300;
  int64_t valid_until_s = 365 * 86400;
};

// A certificate with its private key.
struct Credential {
  X509Ptr cert;
  PkeyPtr key;
};

Result<PkeyPtr> generate_ec_key();  // P-256
// Self-signed CA. REQUIRES: spec.role == kCa.
Result<Credential> make_ca(const CertSpec& spec);
// What issue_cert() changed from the request.
struct IssueNotes {
  // The requested notAfter lay beyond the CA's, so the certificate ends with the CA instead
  // (a chain is only valid while every certificate in it is).
  bool not_after_capped = false;
  std::string not_after;  // the certificate's notAfter, e.g. "Nov 29 23:24:26 2036 GMT"
};

// A certificate signed by `ca` with a fresh key and a random 127-bit serial. Its notAfter is
// capped at the CA's; the cap is reported in `notes` when given, else logged as a warning.
// FailedPrecondition when the CA has already expired.
Result<Credential> issue_cert(const Credential& ca, const CertSpec& spec,
                              IssueNotes* notes = nullptr);
// A CRL signed by `ca`, listing `revoked`, valid for `valid_days`.
Result<X509CrlPtr> make_crl(const Credential& ca, const std::vector<const X509*>& revoked,
                            int valid_days = 30);
// The same for serial numbers in hex (as cert_serial_hex writes them). InvalidArgument for a
// serial that is not hex.
Result<X509CrlPtr> make_crl_for_serials(const Credential& ca,
                                        const std::vector<std::string>& serials_hex,
                                        int valid_days = 30);
// A certificate's serial number, upper-case hex without leading zeros ("0" for zero): what
// `starling certs show` prints and what a CRL lists.
std::string cert_serial_hex(const X509* cert);
// The serial numbers a CRL lists, in the same form.
std::vector<std::string> crl_serials(const X509_CRL* crl);

Result<std::string> cert_to_pem(const X509* cert);
Result<std::string> key_to_pem(EVP_PKEY* key);  // unencrypted PKCS#8
Result<std::string> crl_to_pem(const X509_CRL* crl);
Result<X509Ptr> cert_from_pem(std::string_view pem);
Result<std::vector<X509Ptr>> certs_from_pem(std::string_view pem);  // a bundle, at least one
Result<PkeyPtr> key_from_pem(std::string_view pem);
Result<X509CrlPtr> crl_from_pem(std::string_view pem);

// Identity carried by a certificate.
struct CertIdentity {
  std::string common_name;
  std::string role;  // subject OU, "" when absent
  std::vector<std::string> dns_names;
  std::vector<std::string> ip_addresses;
};
CertIdentity cert_identity(const X509* cert);
// Multi-line human-readable summary (subject, issuer, serial, validity, SANs, usage, SHA-256).
Result<std::string> describe_cert(const X509* cert);

// Whole-file I/O. write_file replaces `path` atomically (temp file + rename) with `mode`.
Result<std::string> read_file(const std::string& path);
Status write_file(const std::string& path, std::string_view contents, unsigned mode);

}  // namespace starling::net
