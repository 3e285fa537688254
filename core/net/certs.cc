// Certificate creation and inspection with the OpenSSL 3 API.
#include "core/net/certs.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace starling::net {
namespace {

struct BioFree {
  void operator()(BIO* p) const { BIO_free(p); }
};
struct BnFree {
  void operator()(BIGNUM* p) const { BN_free(p); }
};
struct ExtFree {
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
};
struct NamesFree {
  void operator()(GENERAL_NAMES* p) const { GENERAL_NAMES_free(p); }
};
struct RevokedFree {
  void operator()(X509_REVOKED* p) const { X509_REVOKED_free(p); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;

Status ssl_error(std::string_view what) {
  std::string m(what);
  const std::string detail = drain_openssl_errors();
  if (!detail.empty()) m += ": " + detail;
  return internal_error(std::move(m));
}

std::string bio_string(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  return n > 0 ? std::string(data, static_cast<size_t>(n)) : std::string();
}

std::string asn1_time_text(const ASN1_TIME* t) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || ASN1_TIME_print(bio.get(), t) != 1) return "(unreadable time)";
  return bio_string(bio.get());
}

BioPtr read_bio(std::string_view pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

Status add_ext(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  std::unique_ptr<X509_EXTENSION, ExtFree> ext(
      X509V3_EXT_nconf_nid(nullptr, &ctx, nid, value.c_str()));
  if (!ext || X509_add_ext(cert, ext.get(), -1) != 1) {
    return ssl_error(std::string("extension ") + OBJ_nid2sn(nid) + " = " + value);
  }
  return ok_status();
}

Status set_random_serial(X509* cert) {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof bytes) != 1) return ssl_error("RAND_bytes");
  bytes[0] &= 0x7F;  // positive
  std::unique_ptr<BIGNUM, BnFree> bn(BN_bin2bn(bytes, sizeof bytes, nullptr));
  if (!bn || !BN_to_ASN1_INTEGER(bn.get(), X509_get_serialNumber(cert))) {
    return ssl_error("serial number");
  }
  return ok_status();
}

// A certificate for `key` with subject from `spec`; issuer and signature are left to the caller.
Result<X509Ptr> new_cert(const CertSpec& spec, EVP_PKEY* key) {
  if (spec.common_name.empty() || spec.common_name.size() > 64) {
    return invalid_argument("certificate name must be 1 to 64 characters");
  }
  X509Ptr cert(X509_new());
  if (!cert || X509_set_version(cert.get(), 2) != 1) return ssl_error("X509_new");
  RETURN_IF_ERROR(set_random_serial(cert.get()));
  if (!X509_gmtime_adj(X509_getm_notBefore(cert.get()), spec.valid_from_s) ||
      !X509_gmtime_adj(X509_getm_notAfter(cert.get()), spec.valid_until_s)) {
    return ssl_error("validity");
  }
  X509_NAME* name = X509_get_subject_name(cert.get());
  const auto add = [&](const char* field, std::string_view value) {
    return X509_NAME_add_entry_by_txt(name, field, MBSTRING_UTF8,
                                      reinterpret_cast<const unsigned char*>(value.data()),
                                      static_cast<int>(value.size()), -1, 0) == 1;
  };
  if (!add("O", "starling federation") || !add("OU", cert_role_name(spec.role)) ||
      !add("CN", spec.common_name)) {
    return ssl_error("subject name");
  }
  if (X509_set_pubkey(cert.get(), key) != 1) return ssl_error("public key");
  return cert;
}

}  // namespace

std::string drain_openssl_errors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out;
}

std::string_view cert_role_name(CertRole role) {
  switch (role) {
    case CertRole::kCa:
      return "ca";
    case CertRole::kServer:
      return "server";
    case CertRole::kClient:
      return "client";
    case CertRole::kPeer:
      return "peer";
    case CertRole::kLeaf:
      return "leaf";
  }
  return "peer";
}

Result<CertRole> parse_cert_role(std::string_view name) {
  for (CertRole r :
       {CertRole::kCa, CertRole::kServer, CertRole::kClient, CertRole::kPeer, CertRole::kLeaf}) {
    if (name == cert_role_name(r)) return r;
  }
  return invalid_argument("unknown certificate role '" + std::string(name) +
                          "' (expected server, client, peer or leaf)");
}

Result<PkeyPtr> generate_ec_key() {
  PkeyPtr key(EVP_EC_gen("P-256"));
  if (!key) return ssl_error("EC P-256 key generation");
  return key;
}

Result<Credential> make_ca(const CertSpec& spec) {
  if (spec.role != CertRole::kCa) return invalid_argument("make_ca needs role ca");
  ASSIGN_OR_RETURN(PkeyPtr key, generate_ec_key());
  ASSIGN_OR_RETURN(X509Ptr cert, new_cert(spec, key.get()));
  if (X509_set_issuer_name(cert.get(), X509_get_subject_name(cert.get())) != 1) {
    return ssl_error("issuer name");
  }
  X509* c = cert.get();
  RETURN_IF_ERROR(add_ext(c, c, NID_basic_constraints, "critical,CA:TRUE,pathlen:0"));
  RETURN_IF_ERROR(add_ext(c, c, NID_key_usage, "critical,keyCertSign,cRLSign"));
  RETURN_IF_ERROR(add_ext(c, c, NID_subject_key_identifier, "hash"));
  RETURN_IF_ERROR(add_ext(c, c, NID_authority_key_identifier, "keyid:always"));
  if (X509_sign(c, key.get(), EVP_sha256()) <= 0) return ssl_error("signing the CA certificate");
  return Credential{std::move(cert), std::move(key)};
}

Result<Credential> issue_cert(const Credential& ca, const CertSpec& spec, IssueNotes* notes) {
  if (spec.role == CertRole::kCa) return invalid_argument("issue_cert cannot make a CA");
  const ASN1_TIME* ca_not_after = X509_get0_notAfter(ca.cert.get());
  if (X509_cmp_current_time(ca_not_after) <= 0) {
    return failed_precondition("the CA certificate expired on " + asn1_time_text(ca_not_after) +
                               ": make a new CA before issuing certificates");
  }
  ASSIGN_OR_RETURN(PkeyPtr key, generate_ec_key());
  ASSIGN_OR_RETURN(X509Ptr cert, new_cert(spec, key.get()));
  IssueNotes local;
  IssueNotes& n = notes != nullptr ? *notes : local;
  n = IssueNotes{};
  const int order = ASN1_TIME_compare(X509_get0_notAfter(cert.get()), ca_not_after);
  if (order == -2) return ssl_error("comparing validity with the CA's");
  if (order > 0) {
    if (X509_set1_notAfter(cert.get(), ca_not_after) != 1) return ssl_error("validity");
    n.not_after_capped = true;
  }
  n.not_after = asn1_time_text(X509_get0_notAfter(cert.get()));
  // A cap of less than a day (a CA and its nodes made together, as simulations do) is not news.
  int cap_days = 0;
  int cap_secs = 0;
  if (n.not_after_capped) {
    const int64_t asked = spec.valid_until_s;
    ASN1_TIME_diff(&cap_days, &cap_secs, nullptr, ca_not_after);
    const int64_t granted = int64_t{cap_days} * 86400 + cap_secs;
    cap_days = static_cast<int>((asked - granted) / 86400);
  }
  if (n.not_after_capped && notes == nullptr && cap_days >= 1) {
    spdlog::warn(
        "certs: the certificate for '{}' ends with its CA on {}, before the {} s asked for",
        spec.common_name, n.not_after, spec.valid_until_s);
  }
  if (X509_set_issuer_name(cert.get(), X509_get_subject_name(ca.cert.get())) != 1) {
    return ssl_error("issuer name");
  }
  X509* c = cert.get();
  X509* issuer = ca.cert.get();
  const char* eku = spec.role == CertRole::kServer   ? "serverAuth"
                    : spec.role == CertRole::kClient ? "clientAuth"
                                                     : "serverAuth,clientAuth";
  RETURN_IF_ERROR(add_ext(c, issuer, NID_basic_constraints, "critical,CA:FALSE"));
  RETURN_IF_ERROR(add_ext(c, issuer, NID_key_usage, "critical,digitalSignature"));
  RETURN_IF_ERROR(add_ext(c, issuer, NID_ext_key_usage, eku));
  RETURN_IF_ERROR(add_ext(c, issuer, NID_subject_key_identifier, "hash"));
  RETURN_IF_ERROR(add_ext(c, issuer, NID_authority_key_identifier, "keyid:always"));
  if (!spec.sans.empty()) {
    std::string list;
    for (const auto& san : spec.sans) {
      if (san.rfind("DNS:", 0) != 0 && san.rfind("IP:", 0) != 0) {
        return invalid_argument("SAN '" + san + "' must start with DNS: or IP:");
      }
      if (san.find(',') != std::string::npos) return invalid_argument("SAN contains ','");
      list += (list.empty() ? "" : ",") + san;
    }
    RETURN_IF_ERROR(add_ext(c, issuer, NID_subject_alt_name, list));
  }
  if (X509_sign(c, ca.key.get(), EVP_sha256()) <= 0) return ssl_error("signing the certificate");
  return Credential{std::move(cert), std::move(key)};
}

namespace {

std::string bn_hex(const ASN1_INTEGER* serial) {
  std::unique_ptr<BIGNUM, BnFree> bn(ASN1_INTEGER_to_BN(serial, nullptr));
  char* hex = bn ? BN_bn2hex(bn.get()) : nullptr;
  std::string out = hex ? hex : "?";
  OPENSSL_free(hex);
  return out;
}

}  // namespace

std::string cert_serial_hex(const X509* cert) { return bn_hex(X509_get0_serialNumber(cert)); }

std::vector<std::string> crl_serials(const X509_CRL* crl) {
  std::vector<std::string> out;
  STACK_OF(X509_REVOKED)* revoked = X509_CRL_get_REVOKED(const_cast<X509_CRL*>(crl));
  for (int i = 0; revoked && i < sk_X509_REVOKED_num(revoked); ++i) {
    out.push_back(bn_hex(X509_REVOKED_get0_serialNumber(sk_X509_REVOKED_value(revoked, i))));
  }
  return out;
}

Result<X509CrlPtr> make_crl(const Credential& ca, const std::vector<const X509*>& revoked,
                            int valid_days) {
  std::vector<std::string> serials;
  for (const X509* cert : revoked) serials.push_back(cert_serial_hex(cert));
  return make_crl_for_serials(ca, serials, valid_days);
}

Result<X509CrlPtr> make_crl_for_serials(const Credential& ca,
                                        const std::vector<std::string>& serials_hex,
                                        int valid_days) {
  X509CrlPtr crl(X509_CRL_new());
  if (!crl || X509_CRL_set_version(crl.get(), 1) != 1 ||
      X509_CRL_set_issuer_name(crl.get(), X509_get_subject_name(ca.cert.get())) != 1) {
    return ssl_error("X509_CRL_new");
  }
  std::unique_ptr<ASN1_TIME, decltype(&ASN1_TIME_free)> now(X509_gmtime_adj(nullptr, -60),
                                                            &ASN1_TIME_free);
  std::unique_ptr<ASN1_TIME, decltype(&ASN1_TIME_free)> next(
      X509_gmtime_adj(nullptr, int64_t{valid_days} * 86400), &ASN1_TIME_free);
  if (!now || !next || X509_CRL_set1_lastUpdate(crl.get(), now.get()) != 1 ||
      X509_CRL_set1_nextUpdate(crl.get(), next.get()) != 1) {
    return ssl_error("CRL validity");
  }
  for (const std::string& hex : serials_hex) {
    BIGNUM* raw = nullptr;
    const bool is_hex =
        !hex.empty() && hex.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos;
    if (!is_hex || BN_hex2bn(&raw, hex.c_str()) != static_cast<int>(hex.size())) {
      BN_free(raw);
      drain_openssl_errors();
      return invalid_argument("certificate serial '" + hex + "' is not a hexadecimal number");
    }
    std::unique_ptr<BIGNUM, BnFree> bn(raw);
    std::unique_ptr<ASN1_INTEGER, decltype(&ASN1_INTEGER_free)> serial(
        BN_to_ASN1_INTEGER(bn.get(), nullptr), &ASN1_INTEGER_free);
    std::unique_ptr<X509_REVOKED, RevokedFree> entry(X509_REVOKED_new());
    if (!serial || !entry || X509_REVOKED_set_serialNumber(entry.get(), serial.get()) != 1 ||
        X509_REVOKED_set_revocationDate(entry.get(), now.get()) != 1 ||
        X509_CRL_add0_revoked(crl.get(), entry.get()) != 1) {
      return ssl_error("CRL entry");
    }
    entry.release();  // owned by the CRL now
  }
  if (X509_CRL_sort(crl.get()) != 1 || X509_CRL_sign(crl.get(), ca.key.get(), EVP_sha256()) <= 0) {
    return ssl_error("signing the CRL");
  }
  return crl;
}

Result<std::string> cert_to_pem(const X509* cert) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_X509(bio.get(), cert) != 1) return ssl_error("PEM_write_bio_X509");
  return bio_string(bio.get());
}

Result<std::string> key_to_pem(EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio ||
      PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return ssl_error("PEM_write_bio_PrivateKey");
  }
  return bio_string(bio.get());
}

Result<std::string> crl_to_pem(const X509_CRL* crl) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_X509_CRL(bio.get(), crl) != 1) {
    return ssl_error("PEM_write_bio_X509_CRL");
  }
  return bio_string(bio.get());
}

Result<X509Ptr> cert_from_pem(std::string_view pem) {
  BioPtr bio = read_bio(pem);
  X509Ptr cert(bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!cert) return ssl_error("not a PEM certificate").with_context("parse");
  return cert;
}

Result<std::vector<X509Ptr>> certs_from_pem(std::string_view pem) {
  BioPtr bio = read_bio(pem);
  std::vector<X509Ptr> out;
  while (bio) {
    X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (!cert) break;
    out.push_back(std::move(cert));
  }
  ERR_clear_error();  // the end of the bundle reads as an error
  if (out.empty()) return invalid_argument("no PEM certificate found");
  return out;
}

Result<PkeyPtr> key_from_pem(std::string_view pem) {
  BioPtr bio = read_bio(pem);
  PkeyPtr key(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!key) return ssl_error("not a PEM private key").with_context("parse");
  return key;
}

Result<X509CrlPtr> crl_from_pem(std::string_view pem) {
  BioPtr bio = read_bio(pem);
  X509CrlPtr crl(bio ? PEM_read_bio_X509_CRL(bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!crl) return ssl_error("not a PEM CRL").with_context("parse");
  return crl;
}

CertIdentity cert_identity(const X509* cert) {
  CertIdentity id;
  const X509_NAME* subject = X509_get_subject_name(cert);
  const auto field = [&](int nid) {
    const int i = X509_NAME_get_index_by_NID(subject, nid, -1);
    if (i < 0) return std::string();
    const ASN1_STRING* s = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, i));
    return std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                       static_cast<size_t>(ASN1_STRING_length(s)));
  };
  id.common_name = field(NID_commonName);
  id.role = field(NID_organizationalUnitName);
  std::unique_ptr<GENERAL_NAMES, NamesFree> names(
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr)));
  for (int i = 0; names && i < sk_GENERAL_NAME_num(names.get()); ++i) {
    const GENERAL_NAME* n = sk_GENERAL_NAME_value(names.get(), i);
    if (n->type == GEN_DNS) {
      const ASN1_STRING* s = n->d.dNSName;
      id.dns_names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                                static_cast<size_t>(ASN1_STRING_length(s)));
    } else if (n->type == GEN_IPADD) {
      const ASN1_OCTET_STRING* s = n->d.iPAddress;
      const int len = ASN1_STRING_length(s);
      char text[INET6_ADDRSTRLEN] = {};
      if ((len == 4 || len == 16) &&
          inet_ntop(len == 4 ? AF_INET : AF_INET6, ASN1_STRING_get0_data(s), text, sizeof text)) {
        id.ip_addresses.emplace_back(text);
      }
    }
  }
  return id;
}

Result<std::string> describe_cert(const X509* cert) {
  const auto name_line = [](const X509_NAME* name) {
    BioPtr bio(BIO_new(BIO_s_mem()));
    X509_NAME_print_ex(bio.get(), name, 0, XN_FLAG_ONELINE & ~ASN1_STRFLGS_ESC_MSB);
    return bio_string(bio.get());
  };
  const auto time_line = [](const ASN1_TIME* t) {
    BioPtr bio(BIO_new(BIO_s_mem()));
    ASN1_TIME_print(bio.get(), t);
    return bio_string(bio.get());
  };
  const std::string serial_text = cert_serial_hex(cert);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int md_len = 0;
  if (X509_digest(cert, EVP_sha256(), md, &md_len) != 1) return ssl_error("certificate digest");
  std::string fingerprint;
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (unsigned i = 0; i < md_len; ++i) {
    if (i) fingerprint += ':';
    fingerprint += kHex[md[i] >> 4];
    fingerprint += kHex[md[i] & 15];
  }
  const CertIdentity id = cert_identity(cert);
  std::ostringstream out;
  out << "subject:     " << name_line(X509_get_subject_name(cert)) << "\n"
      << "issuer:      " << name_line(X509_get_issuer_name(cert)) << "\n"
      << "serial:      " << serial_text << "\n"
      << "not before:  " << time_line(X509_get0_notBefore(cert)) << "\n"
      << "not after:   " << time_line(X509_get0_notAfter(cert)) << "\n"
      << "role:        " << (id.role.empty() ? "-" : id.role) << "\n"
      << "is CA:       " << (X509_check_ca(const_cast<X509*>(cert)) ? "yes" : "no") << "\n";
  out << "SANs:       ";
  for (const auto& d : id.dns_names) out << " DNS:" << d;
  for (const auto& ip : id.ip_addresses) out << " IP:" << ip;
  if (id.dns_names.empty() && id.ip_addresses.empty()) out << " -";
  out << "\n";
  const uint32_t xku = X509_get_extended_key_usage(const_cast<X509*>(cert));
  out << "usage:      " << ((xku & XKU_SSL_SERVER) ? " serverAuth" : "")
      << ((xku & XKU_SSL_CLIENT) ? " clientAuth" : "") << "\n";
  out << "sha256:      " << fingerprint << "\n";
  return out.str();
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open " + path + ": " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return internal_error("cannot read " + path);
  return ss.str();
}

Status write_file(const std::string& path, std::string_view contents, unsigned mode) {
  const std::string tmp = path + ".tmp";
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, static_cast<mode_t>(mode));
  if (fd < 0) return internal_error("cannot create " + tmp + ": " + std::strerror(errno));
  // fchmod: the umask or a leftover temp file must not widen the mode of a private key.
  bool ok = ::fchmod(fd, static_cast<mode_t>(mode)) == 0;
  size_t done = 0;
  while (ok && done < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ::fsync(fd) == 0 && ok;
  ok = ::close(fd) == 0 && ok;
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    ::unlink(tmp.c_str());
    return internal_error("cannot write " + path + ": " + err);
  }
  return ok_status();
}

}  // namespace starling::net
