// The diffusion models federated from the command line: `starling aggregator` and two
// `starling client` processes train a tiny DDPM over mutual TLS, `starling aggregator --simulate`
// a tiny MDLM, and `starling sample` reads the checkpoints they leave.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "tests/testing/child_process.h"
#include "tests/testing/cli_federation.h"

namespace fs = std::filesystem;

namespace {

using starling::testing::ChildProcess;
using Run = starling::testing::CommandResult;
constexpr auto run = starling::testing::run_starling;
constexpr auto spawn = starling::testing::spawn_starling;

// The child's exit code after at most `seconds`; -2 if it was still running (then killed).
int wait_for(ChildProcess& child, int seconds) {
  return child.wait_or_kill(std::chrono::seconds(seconds));
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// True when `file` is in the data directory the children will use: $STARLING_DATA_DIR, else
// ../shared/data, else the small cut that ships in tests/fixtures/data (then exported, so a
// bare clone runs these tests too).
bool have_data(const char* file) {
  const char* env = std::getenv("STARLING_DATA_DIR");
  std::error_code ec;
  if (env && *env) return fs::exists(fs::path(env) / file, ec);
  if (fs::exists(fs::path(STARLING_SOURCE_DIR) / "../shared/data" / file, ec)) return true;
  const fs::path fixtures = fs::path(STARLING_SOURCE_DIR) / "tests/fixtures/data";
  ::setenv("STARLING_DATA_DIR", fixtures.c_str(), 1);
  return fs::exists(fixtures / file, ec);
}

}  // namespace

TEST_CASE("cli: a DDPM federation of an aggregator and two clients over TLS", "[apps]") {
  if (!have_data("mnist/train-images-idx3-ubyte.gz")) return;
  const fs::path d = fs::temp_directory_path() / ("starling_ddpm_cli_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  starling::testing::make_cli_pki(d, {"client-0", "client-1"}, "ddpm-test");
  const int port = starling::testing::test_port(7919);
  const std::string common =
      "[rounds]\nnum_rounds = 2\nclients_per_round = 2\nmin_available = 2\nmin_updates = 2\n"
      "round_deadline_ms = 30000\n"
      "[local]\nlocal_steps = 1\nbatch_size = 2\nlearning_rate = 0.001\n"
      "codec = \"int8:block=64,ef=1\"\n"
      "[data]\ndataset = \"mnist\"\nnum_clients = 2\npartition = \"DIRICHLET\"\n"
      "[model]\narch = \"DDPM\"\nlocal_optimizer = \"ADAMW\"\n"
      "[model.ddpm]\nbase_channels = 4\nchannel_mult = [1, 2]\ngroups = 2\nattention = false\n"
      "timesteps = 20\nsampling_steps = 4\nnum_samples = 4\n"
      "[eval]\nevery_rounds = 1\nmax_examples = 8\n";
  std::ofstream(d / "agg.toml") << starling::testing::aggregator_tls_toml(d)
                                << "[server]\nport = " << port << "\nstate_dir = \""
                                << (d / "state").string() << "\"\n"
                                << common;
  for (int k = 0; k < 2; ++k) {
    const std::string name = "client-" + std::to_string(k);
    std::ofstream(d / (name + ".toml")) << starling::testing::client_tls_toml(d, name) << common
                                        << "[client]\nserver_port = " << port
                                        << "\nserver_name = \"localhost\"\npartition_index = " << k
                                        << "\nbackoff_max_ms = 300\nstate_path = \"none\"\n";
  }
  ChildProcess agg = spawn("aggregator --config " + (d / "agg.toml").string(), d / "agg.log");
  ChildProcess c0 = spawn("client --config " + (d / "client-0.toml").string(), d / "client-0.log");
  ChildProcess c1 = spawn("client --config " + (d / "client-1.toml").string(), d / "client-1.log");
  INFO(slurp(d / "agg.log"));
  CHECK(wait_for(c0, 60) == 0);
  CHECK(wait_for(c1, 60) == 0);
  REQUIRE(wait_for(agg, 30) == 0);
  const std::string metrics = slurp(d / "state" / "metrics.jsonl");
  CHECK(std::count(metrics.begin(), metrics.end(), '\n') == 2);
  CHECK_THAT(metrics, Catch::Contains("\"test_loss\""));
  // The aggregator's checkpoint samples like a trained DDPM's.
  const Run s = run("sample --checkpoint " + (d / "state" / "model.safetensors").string() +
                    " --num 2 --out " + (d / "s.png").string());
  INFO(s.out);
  CHECK(s.rc == 0);
  CHECK(fs::file_size(d / "s.png") > 0);
  fs::remove_all(d);
}

TEST_CASE("cli: aggregator --simulate trains a tiny federated MDLM that samples", "[apps]") {
  if (!have_data("tinyshakespeare/input.txt")) return;
  const fs::path d = fs::temp_directory_path() / ("starling_mdlm_cli_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  std::ofstream(d / "mdlm.toml")
      << "[server]\nstate_dir = \"" << (d / "state").string() << "\"\n"
      << "[simulate]\nnum_clients = 2\n"
      << "[data]\ndataset = \"shakespeare\"\npartition = \"ROLES\"\nnum_clients = 2\n"
      << "min_role_chars = 20000\n"
      << "[model]\narch = \"MDLM\"\nn_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 16\n"
      << "[model.diffusion]\nsampling_steps = 4\n"
      << "[rounds]\nnum_rounds = 1\nclients_per_round = 2\nmin_available = 2\nmin_updates = 2\n"
      << "[local]\nlocal_steps = 1\nbatch_size = 2\nlearning_rate = 0.1\n"
      << "codec = \"topk:ratio=0.1,ef=1\"\n[eval]\nmax_examples = 4\n";
  const Run a = run("aggregator --simulate --config " + (d / "mdlm.toml").string());
  INFO(a.out);
  REQUIRE(a.rc == 0);
  const Run s = run("sample --checkpoint " + (d / "state" / "model.safetensors").string());
  INFO(s.out);
  CHECK(s.rc == 0);
  CHECK(s.out.size() >= 16);  // one sequence of block_size characters
  fs::remove_all(d);
}
