// The server as an outside TLS client sees it: `openssl s_client` negotiates TLS 1.3 and is
// asked for a client certificate from the federation's CA; without one it gets no service.
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>

#include "tests/testing/child_process.h"
#include "tests/testing/loopback.h"
#include "tests/testing/tls_fixtures.h"

namespace starling::net {

TEST_CASE("openssl s_client sees TLS 1.3 and a client-certificate request", "[net]") {
  if (std::system("command -v openssl > /dev/null 2>&1") != 0) {
    WARN("openssl command not found; skipped");
    return;
  }
  testing::TestPki pki("s-client-federation");
  const testing::TestNode server = pki.issue("aggregator", CertRole::kServer);
  asio::io_context io;
  ServerOptions opts;
  opts.connection.deadlines.handshake = Millis(3000);
  testing::LoopbackServer srv(
      io, TlsConfig{pki.ca_pem(), server.cert_pem, server.key_pem, "", true}, opts);
  const auto dir =
      std::filesystem::temp_directory_path() / ("starling_s_client_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  { std::ofstream(dir / "ca.pem") << pki.ca_pem(); }
  const std::string cmd =
      "echo | timeout 10 openssl s_client -connect 127.0.0.1:" + std::to_string(srv.port()) +
      " -servername localhost -CAfile " + (dir / "ca.pem").string() + " -verify_return_error 2>&1";
  // The shell and the pipeline are one process group, killed with the test if it fails.
  auto fut = std::async(std::launch::async, [cmd] {
    return testing::run_command({"/bin/sh", "-c", cmd}).out;
  });
  REQUIRE(testing::run_until(io, std::chrono::milliseconds(15000), [&] {
    return fut.wait_for(std::chrono::milliseconds(0)) == std::future_status::ready;
  }));
  const std::string out = fut.get();
  std::filesystem::remove_all(dir);
  INFO(out);
  REQUIRE_THAT(out, Catch::Contains("TLSv1.3"));
  REQUIRE_THAT(out, Catch::Contains("Acceptable client certificate CA names"));
  REQUIRE_THAT(out, Catch::Contains("s-client-federation"));
  REQUIRE_THAT(out, Catch::Contains("Verify return code: 0 (ok)"));
  // No client certificate: the server never hands this peer a connection.
  REQUIRE(srv.accepted.empty());
}

}  // namespace starling::net
