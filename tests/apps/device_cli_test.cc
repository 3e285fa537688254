// `--device` / `--gpus` and [client] device through the real CLI on a machine without a GPU:
// asking for one is an error that names the key (never a silent CPU run), in `starling simulate`,
// `starling aggregator --simulate` and `starling client --check`; bad values are named too.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/testing/child_process.h"

namespace fs = std::filesystem;
using Catch::Contains;
using starling::testing::run_starling;

namespace {

// A tiny GPT federation on the fixture's Tiny Shakespeare, with local AdamW (what the fused
// engine runs).
fs::path write_gpt_config(const fs::path& d, const std::string& client_keys) {
  fs::create_directories(d);
  const fs::path p = d / "gpt.toml";
  std::ofstream(p) << "[rounds]\nnum_rounds = 1\nclients_per_round = 2\nmin_available = 2\n"
                   << "[local]\nlocal_steps = 1\nbatch_size = 2\nlearning_rate = 0.01\n"
                   << "[data]\ndataset = \"shakespeare\"\npartition = \"ROLES\"\n"
                   << "num_clients = 2\nmin_role_chars = 20000\ndata_dir = \""
                   << STARLING_SOURCE_DIR << "/tests/fixtures/data\"\n"
                   << "[model]\narch = \"GPT\"\nn_layer = 1\nn_head = 2\nn_embd = 16\n"
                   << "block_size = 16\nlocal_optimizer = \"ADAMW\"\n"
                   << "[eval]\nevery_rounds = 0\n[server]\nstate_dir = \"" << (d / "state").string()
                   << "\"\n[client]\n"
                   << client_keys;
  return p;
}

}  // namespace

TEST_CASE("cli: a GPU asked for where there is none is an error naming the key", "[apps]") {
  const fs::path d = fs::temp_directory_path() / "device_cli";
  const fs::path cfg = write_gpt_config(d, "");
  const std::string out = " -o " + (d / "out").string();
  // No GPU on the machines the suite runs on: a CPU build says so, a CUDA build finds none.
  auto r = run_starling("simulate -q -c " + cfg.string() + out + " --device cuda");
  INFO(r.out);
  CHECK(r.rc != 0);
  CHECK_THAT(r.out, Contains("client.device") && Contains("cuda"));
  r = run_starling("aggregator --simulate -c " + cfg.string() + " --device cuda --gpus 0");
  INFO(r.out);
  CHECK(r.rc != 0);
  CHECK_THAT(r.out, Contains("client.device"));
  // The same config on the CPU trains.
  r = run_starling("simulate -q -c " + cfg.string() + out + "-cpu --device cpu");
  INFO(r.out);
  CHECK(r.rc == 0);
  // Bad values and combinations, named by key.
  r = run_starling("simulate -q -c " + cfg.string() + out + " --device tpu");
  CHECK(r.rc != 0);
  CHECK_THAT(r.out, Contains("client.device") && Contains("\"cpu\" or \"cuda\""));
  // Several GPUs: virtual clients spread over them, each checked (none here).
  r = run_starling("simulate -q -c " + cfg.string() + out + " --device cuda --gpus 0,1");
  CHECK(r.rc != 0);
  CHECK_THAT(r.out, Contains("client.device") && Contains("cuda"));
  r = run_starling("simulate -q -c " + cfg.string() + out + " --device cuda --gpus 1,0,1");
  CHECK(r.rc != 0);
  CHECK_THAT(r.out, Contains("client.gpus") && Contains("twice"));
  r = run_starling("simulate -q -c " + cfg.string() + out + " --gpus 0");
  CHECK(r.rc != 0);
  CHECK_THAT(r.out, Contains("client.gpus") && Contains("applies to client.device"));
  r = run_starling("simulate -q -c " + cfg.string() + out +
                   " --device cuda --set model.local_optimizer=SGD");
  CHECK(r.rc != 0);
  CHECK_THAT(r.out, Contains("model.local_optimizer"));
  fs::remove_all(d);
}

TEST_CASE(
    "cli: client --check with [client] device = \"cuda\" fails its trainer line, naming "
    "the key",
    "[apps]") {
  const fs::path d = fs::temp_directory_path() / "device_check";
  const fs::path cfg = write_gpt_config(d, "device = \"cuda\"\n");
  // Certificates for the client (the check reads them first).
  REQUIRE(run_starling("certs init-ca --out " + (d / "ca").string() + " --name t").rc == 0);
  REQUIRE(run_starling("certs issue --ca " + (d / "ca").string() +
                       " --name client-0 --role client --out " + (d / "certs").string())
              .rc == 0);
  std::ofstream(cfg, std::ios::app)
      << "node_id = \"client-0\"\n[tls]\nca = \"" << (d / "certs" / "ca.crt").string()
      << "\"\ncert = \"" << (d / "certs" / "client-0.crt").string() << "\"\nkey = \""
      << (d / "certs" / "client-0.key").string() << "\"\n";
  const auto r = run_starling("client --check --check-timeout 1 -c " + cfg.string());
  INFO(r.out);
  CHECK(r.rc != 0);
  CHECK_THAT(r.out, Contains("FAIL  data") && Contains("client.device"));
  CHECK_THAT(r.out, Contains("ok    gpu") && Contains("the client trains on cuda:0"));
  fs::remove_all(d);
}
