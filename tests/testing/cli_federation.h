// What the command-line federation tests share: a PKI made with `starling certs` (an
// aggregator with a server certificate for localhost, and clients), the [tls] sections that
// use it, a port, and waiting for a line in a log.
#pragma once

#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/child_process.h"

namespace starling::testing {

inline std::string slurp_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// <dir>/ca (the CA), <dir>/agg (aggregator, server role, DNS:localhost and IP:127.0.0.1) and
// <dir>/<name> for each client name (client role).
inline void make_cli_pki(const std::filesystem::path& dir, const std::vector<std::string>& clients,
                         const std::string& ca_name = "cli-test") {
  REQUIRE(run_starling("certs init-ca --out " + (dir / "ca").string() + " --name " + ca_name).rc ==
          0);
  REQUIRE(run_starling("certs issue --ca " + (dir / "ca").string() +
                       " --name aggregator --role server --san DNS:localhost,IP:127.0.0.1 --out " +
                       (dir / "agg").string())
              .rc == 0);
  for (const auto& c : clients) {
    REQUIRE(run_starling("certs issue --ca " + (dir / "ca").string() + " --name " + c +
                         " --role client --out " + (dir / c).string())
                .rc == 0);
  }
}

// The [tls] section of the aggregator, or of client `name`, of make_cli_pki(dir, ...).
inline std::string aggregator_tls_toml(const std::filesystem::path& dir) {
  return "[tls]\nca = \"" + (dir / "agg" / "ca.crt").string() + "\"\ncert = \"" +
         (dir / "agg" / "aggregator.crt").string() + "\"\nkey = \"" +
         (dir / "agg" / "aggregator.key").string() + "\"\n";
}
inline std::string client_tls_toml(const std::filesystem::path& dir, const std::string& name) {
  return "[tls]\nca = \"" + (dir / name / "ca.crt").string() + "\"\ncert = \"" +
         (dir / name / (name + ".crt")).string() + "\"\nkey = \"" +
         (dir / name / (name + ".key")).string() + "\"\n";
}

// A TCP port for this test process (from its pid: binding port 0 and passing it on would race).
// Below Linux's ephemeral range (32768 and up): a port there can be the local end of another
// test's outgoing connection, and the aggregator then fails to bind.
inline int test_port(int salt) { return 20000 + static_cast<int>((getpid() + salt) % 12000); }

// Whether `text` appears in the file `log` within `timeout`.
inline bool wait_for_text(const std::filesystem::path& log, const std::string& text,
                          std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (slurp_file(log).find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return slurp_file(log).find(text) != std::string::npos;
}

}  // namespace starling::testing
