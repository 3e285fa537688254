// In-memory test PKI.
#include "tests/testing/tls_fixtures.h"

#include <stdexcept>

namespace starling::testing {
namespace {

template <typename T>
T must(Result<T> r, const char* what) {
  if (!r.ok()) throw std::runtime_error(std::string(what) + ": " + r.status().to_string());
  return std::move(r).value();
}

}  // namespace

TestPki::TestPki(const std::string& federation) {
  net::CertSpec spec;
  spec.common_name = federation;
  spec.role = net::CertRole::kCa;
  spec.valid_until_s = 7 * 86400;
  ca_ = must(net::make_ca(spec), "test CA");
  ca_pem_ = must(net::cert_to_pem(ca_.cert.get()), "test CA PEM");
}

TestNode TestPki::issue(const std::string& name, net::CertRole role, std::vector<std::string> sans,
                        int64_t valid_from_s, int64_t valid_until_s) const {
  net::CertSpec spec;
  spec.common_name = name;
  spec.role = role;
  spec.sans = std::move(sans);
  spec.valid_from_s = valid_from_s;
  spec.valid_until_s = valid_until_s;
  net::Credential c = must(net::issue_cert(ca_, spec), "test certificate");
  TestNode node;
  node.cert_pem = must(net::cert_to_pem(c.cert.get()), "certificate PEM");
  node.key_pem = must(net::key_to_pem(c.key.get()), "key PEM");
  node.cert = std::move(c.cert);
  return node;
}

std::string TestPki::crl_pem(const std::vector<const TestNode*>& revoked) const {
  std::vector<const X509*> certs;
  for (const TestNode* n : revoked) certs.push_back(n->cert.get());
  net::X509CrlPtr crl = must(net::make_crl(ca_, certs), "test CRL");
  return must(net::crl_to_pem(crl.get()), "CRL PEM");
}

}  // namespace starling::testing
