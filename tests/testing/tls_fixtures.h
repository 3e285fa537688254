// A throwaway federation PKI made in memory for tests: a CA and node certificates (valid,
// expired, from another CA, revoked) as PEM. Uses core/net/certs: link starling_core_net.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/net/certs.h"

namespace starling::testing {

// A node's certificate and key; `cert` is kept for revocation lists.
struct TestNode {
  std::string cert_pem;
  std::string key_pem;
  net::X509Ptr cert;
};

class TestPki {
 public:
  // A fresh CA named `federation`. Throws std::runtime_error on failure (tests only).
  explicit TestPki(const std::string& federation = "test-federation");

  // A certificate for `name` signed by this CA, valid from valid_from_s to valid_until_s
  // seconds relative to now, with SANs DNS:localhost and IP:127.0.0.1 unless given.
  TestNode issue(const std::string& name, net::CertRole role,
                 std::vector<std::string> sans = {"DNS:localhost", "IP:127.0.0.1"},
                 int64_t valid_from_s = -300, int64_t valid_until_s = 86400) const;
  // A CRL of this CA listing `revoked`.
  std::string crl_pem(const std::vector<const TestNode*>& revoked) const;

  const std::string& ca_pem() const { return ca_pem_; }

 private:
  net::Credential ca_;
  std::string ca_pem_;
};

}  // namespace starling::testing
