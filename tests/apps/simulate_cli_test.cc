// `starling simulate` in a network namespace whose loopback interface is down: the clients can
// never reach the loopback aggregator, and the run must say so within
// simulate.connect_timeout_s instead of retrying for ever.
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/testing/child_process.h"

namespace fs = std::filesystem;

TEST_CASE("cli: simulate with loopback down fails within simulate.connect_timeout_s", "[apps]") {
  using starling::testing::run_shell;
  // Whether this machine lets us make a network namespace (root, or user namespaces allowed).
  if (run_shell("unshare -n true", std::chrono::seconds(10)).rc != 0) {
    WARN("skipped: `unshare -n` is not permitted here, so loopback cannot be taken down");
    return;
  }
  const fs::path d = fs::temp_directory_path() / "sim_no_lo";
  fs::create_directories(d);
  std::ofstream(d / "sim.toml")
      << "[rounds]\nnum_rounds = 2\nclients_per_round = 2\nmin_available = 2\n"
      << "[local]\nlocal_steps = 1\nbatch_size = 10\nlearning_rate = 0.05\n"
      << "[data]\ndataset = \"mnist\"\nnum_clients = 2\ndata_dir = \"" << STARLING_SOURCE_DIR
      << "/tests/fixtures/data\"\n[model]\nhidden = 8\n[eval]\nevery_rounds = 0\n"
      << "[simulate]\nmode = \"LOOPBACK\"\nconnect_timeout_s = 2\n";
  const auto t0 = std::chrono::steady_clock::now();
  // A fresh network namespace starts with `lo` down: nothing listens or connects on 127.0.0.1.
  const auto r = run_shell("unshare -n " + starling::testing::starling_binary() +
                               " --log-level warn simulate -c " + (d / "sim.toml").string() +
                               " -o " + (d / "out").string() + " 2>&1",
                           std::chrono::seconds(120));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(r.out);
  CHECK(r.rc != 0);
  CHECK_THAT(r.out, Catch::Contains("no client reached the loopback aggregator") &&
                        Catch::Contains("simulate.connect_timeout_s = 2 s"));
  CHECK(seconds < 60);
  // Zero is refused with the key's name.
  std::ofstream(d / "zero.toml") << "[simulate]\nconnect_timeout_s = 0\n";
  const auto z = starling::testing::run_starling("simulate -c " + (d / "zero.toml").string() +
                                                 " -o " + (d / "out0").string());
  CHECK(z.rc != 0);
  CHECK_THAT(z.out, Catch::Contains("simulate.connect_timeout_s"));
}
