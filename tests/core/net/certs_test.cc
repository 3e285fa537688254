// Certificate tooling: issue, PEM round trip, identity and description, private key files.
#include "core/net/certs.h"

#include <sys/stat.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>

namespace starling::net {
namespace {

CertSpec spec(std::string name, CertRole role, std::vector<std::string> sans = {}) {
  CertSpec s;
  s.common_name = std::move(name);
  s.role = role;
  s.sans = std::move(sans);
  return s;
}

TEST_CASE("a CA issues certificates that carry the node identity", "[net]") {
  auto ca = make_ca(spec("federation-1", CertRole::kCa));
  REQUIRE(ca.ok());
  auto node = issue_cert(*ca, spec("edge-7", CertRole::kPeer, {"DNS:edge-7.lan", "IP:10.1.2.3"}));
  REQUIRE(node.ok());

  auto pem = cert_to_pem(node->cert.get());
  REQUIRE(pem.ok());
  auto back = cert_from_pem(*pem);
  REQUIRE(back.ok());
  const CertIdentity id = cert_identity(back->get());
  CHECK(id.common_name == "edge-7");
  CHECK(id.role == "peer");
  CHECK(id.dns_names == std::vector<std::string>{"edge-7.lan"});
  CHECK(id.ip_addresses == std::vector<std::string>{"10.1.2.3"});

  auto text = describe_cert(back->get());
  REQUIRE(text.ok());
  CHECK_THAT(*text, Catch::Contains("CN = edge-7"));
  CHECK_THAT(*text, Catch::Contains("CN = federation-1"));
  CHECK_THAT(*text, Catch::Contains("serverAuth clientAuth"));
  CHECK_THAT(*text, Catch::Contains("is CA:       no"));
  auto ca_text = describe_cert(ca->cert.get());
  REQUIRE(ca_text.ok());
  CHECK_THAT(*ca_text, Catch::Contains("is CA:       yes"));

  auto key_pem = key_to_pem(node->key.get());
  REQUIRE(key_pem.ok());
  auto key = key_from_pem(*key_pem);
  REQUIRE(key.ok());
  CHECK(EVP_PKEY_eq(key->get(), node->key.get()) == 1);
}

TEST_CASE("a CRL lists serials, survives PEM and refuses what is not hex", "[net]") {
  auto ca = make_ca(spec("federation-1", CertRole::kCa));
  REQUIRE(ca.ok());
  auto a = issue_cert(*ca, spec("client-a", CertRole::kClient));
  auto b = issue_cert(*ca, spec("client-b", CertRole::kClient));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  const std::string sa = cert_serial_hex(a->cert.get());
  const std::string sb = cert_serial_hex(b->cert.get());
  CHECK(sa != sb);
  CHECK(sa.find_first_not_of("0123456789ABCDEF") == std::string::npos);
  auto text = describe_cert(a->cert.get());
  REQUIRE(text.ok());
  CHECK_THAT(*text, Catch::Contains("serial:      " + sa));

  auto crl = make_crl_for_serials(*ca, {sb, sa});
  REQUIRE(crl.ok());
  auto pem = crl_to_pem(crl->get());
  REQUIRE(pem.ok());
  auto back = crl_from_pem(*pem);
  REQUIRE(back.ok());
  auto listed = crl_serials(back->get());
  std::sort(listed.begin(), listed.end());
  std::vector<std::string> want = {sa, sb};
  std::sort(want.begin(), want.end());
  CHECK(listed == want);
  // make_crl of certificates lists the same serials.
  auto by_cert = make_crl(*ca, {a->cert.get()});
  REQUIRE(by_cert.ok());
  CHECK(crl_serials(by_cert->get()) == std::vector<std::string>{sa});
  CHECK(crl_serials(make_crl_for_serials(*ca, {})->get()).empty());
  for (const std::string bad : {"", "12G4", "-5", "0x12"}) {
    auto r = make_crl_for_serials(*ca, {bad});
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("not a hexadecimal number"));
  }
}

TEST_CASE("bad certificate requests and input are errors", "[net]") {
  auto ca = make_ca(spec("federation-1", CertRole::kCa));
  REQUIRE(ca.ok());
  CHECK_FALSE(issue_cert(*ca, spec("x", CertRole::kServer, {"URI:http://x"})).ok());
  CHECK_FALSE(issue_cert(*ca, spec("", CertRole::kServer)).ok());
  CHECK_FALSE(issue_cert(*ca, spec("x", CertRole::kCa)).ok());
  CHECK_FALSE(make_ca(spec("x", CertRole::kServer)).ok());
  CHECK_FALSE(cert_from_pem("-----BEGIN CERTIFICATE-----\ngarbage\n").ok());
  CHECK_FALSE(key_from_pem("").ok());
  CHECK_FALSE(certs_from_pem("nothing").ok());
  CHECK(parse_cert_role("server").ok());
  CHECK_FALSE(parse_cert_role("admin").ok());
  CHECK(drain_openssl_errors().empty());
}

TEST_CASE("issued certificates never outlive their CA", "[net]") {
  CertSpec ca_spec = spec("federation-1", CertRole::kCa);
  ca_spec.valid_until_s = 10 * 86400;
  auto ca = make_ca(ca_spec);
  REQUIRE(ca.ok());
  const ASN1_TIME* ca_end = X509_get0_notAfter(ca->cert.get());

  SECTION("a request beyond the CA's notAfter is capped to it, and says so") {
    CertSpec s = spec("edge-1", CertRole::kClient);
    s.valid_until_s = 365 * 86400;
    IssueNotes notes;
    auto node = issue_cert(*ca, s, &notes);
    REQUIRE(node.ok());
    CHECK(notes.not_after_capped);
    CHECK(ASN1_TIME_compare(X509_get0_notAfter(node->cert.get()), ca_end) == 0);
    auto text = describe_cert(node->cert.get());
    REQUIRE(text.ok());
    CHECK_FALSE(notes.not_after.empty());
    CHECK_THAT(*text, Catch::Contains(notes.not_after));
    // Without notes the cap still applies (and is logged).
    auto quiet = issue_cert(*ca, s);
    REQUIRE(quiet.ok());
    CHECK(ASN1_TIME_compare(X509_get0_notAfter(quiet->cert.get()), ca_end) == 0);
  }
  SECTION("a request within the CA's validity is kept") {
    CertSpec s = spec("edge-2", CertRole::kServer);
    s.valid_until_s = 86400;
    IssueNotes notes;
    notes.not_after_capped = true;  // overwritten
    auto node = issue_cert(*ca, s, &notes);
    REQUIRE(node.ok());
    CHECK_FALSE(notes.not_after_capped);
    CHECK(ASN1_TIME_compare(X509_get0_notAfter(node->cert.get()), ca_end) < 0);
    CHECK(X509_cmp_time(X509_get0_notAfter(node->cert.get()), nullptr) > 0);
  }
  SECTION("an expired CA issues nothing") {
    CertSpec old_spec = spec("federation-old", CertRole::kCa);
    old_spec.valid_from_s = -2 * 86400;
    old_spec.valid_until_s = -86400;
    auto old_ca = make_ca(old_spec);
    REQUIRE(old_ca.ok());
    auto node = issue_cert(*old_ca, spec("edge-3", CertRole::kPeer));
    CHECK(node.status().code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(node.status().message(), Catch::Contains("CA certificate expired"));
  }
}

TEST_CASE("private keys are written with mode 0600", "[net]") {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("starling_certs_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "node.key").string();
  REQUIRE(write_file(path, "secret", 0600).ok());
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  auto back = read_file(path);
  REQUIRE(back.ok());
  CHECK(*back == "secret");
  CHECK(read_file((dir / "missing").string()).status().code() == StatusCode::kNotFound);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace starling::net
