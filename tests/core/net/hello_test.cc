// Hello checks: the claimed identity and role must match the verified certificate.
#include "core/net/hello.h"

#include <catch2/catch.hpp>

#include "core/wire/envelope.h"

namespace starling::net {
namespace {

TEST_CASE("a Hello must match the peer's certificate", "[net]") {
  const PeerIdentity peer{"client-1", "client", {}, {}, "127.0.0.1:5000", "1F"};
  v1::Hello hello = make_hello("client-1", v1::ROLE_CLIENT, {"int8_block", "topk"}, 1 << 20);
  CHECK(check_hello(hello, peer).ok());

  SECTION("another node id") {
    hello.set_node_id("client-2");
    const Status s = check_hello(hello, peer);
    CHECK(s.code() == StatusCode::kPermissionDenied);
    CHECK_THAT(s.message(), Catch::Contains("certificate names 'client-1'"));
  }
  SECTION("a role the certificate does not allow") {
    hello.set_role(v1::ROLE_AGGREGATOR);
    CHECK(check_hello(hello, peer).code() == StatusCode::kPermissionDenied);
    hello.set_role(v1::ROLE_UNSPECIFIED);
    CHECK(check_hello(hello, peer).code() == StatusCode::kPermissionDenied);
  }
  SECTION("another protocol version") {
    hello.set_protocol_version(wire::kProtocolVersion + 1);
    CHECK(check_hello(hello, peer).code() == StatusCode::kFailedPrecondition);
  }
}

TEST_CASE("codec negotiation picks our first shared preference", "[net]") {
  const v1::Hello theirs = make_hello("p", v1::ROLE_PEER, {"sign", "topk", "identity"}, 1024);
  auto c = negotiate_codec({"powersgd", "topk", "sign"}, theirs);
  REQUIRE(c.ok());
  CHECK(*c == "topk");
  CHECK(negotiate_codec({"qsgd"}, theirs).status().code() == StatusCode::kNotFound);
}

}  // namespace
}  // namespace starling::net
