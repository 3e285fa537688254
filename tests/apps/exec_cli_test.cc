// Your own model through the exec trainer ([client] trainer = "exec", docs/own_model.md), from
// the command line: `starling client` processes over mutual TLS whose rounds are trained by a
// Python program (examples/exec_protocol/linreg.py, standard library only); a trainer that
// crashes or hangs costs that round only; the PyTorch example when torch is importable.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/child_process.h"
#include "tests/testing/cli_federation.h"

namespace fs = std::filesystem;

namespace {

using starling::testing::ChildProcess;
using std::chrono::seconds;
constexpr auto run = starling::testing::run_starling;
constexpr auto spawn = starling::testing::spawn_starling;
const std::string kExamples = std::string(STARLING_SOURCE_DIR) + "/examples";

constexpr auto slurp = starling::testing::slurp_file;

// Every "test loss X" the aggregator logged, in order.
std::vector<double> test_losses(const std::string& log) {
  std::vector<double> out;
  static const std::regex re("test loss ([0-9.e+-]+)");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator();
       ++it) {
    out.push_back(std::stod((*it)[1]));
  }
  return out;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / (name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// The linreg federation: EXTERNAL model, exec trainer, evaluation by the same program.
std::string linreg_config(const fs::path& d, int clients, int rounds, int timeout_s) {
  const std::string py = kExamples + "/exec_protocol/linreg.py";
  return "[rounds]\nnum_rounds = " + std::to_string(rounds) +
         "\nclients_per_round = " + std::to_string(clients) +
         "\nmin_available = " + std::to_string(clients) +
         "\nmin_updates = 1\nround_deadline_ms = 20000\n"
         "[local]\nlocal_steps = 20\nbatch_size = 16\nlearning_rate = 0.1\n"
         "codec = \"topk:ratio=0.6,ef=1\"\n"
         "[data]\nnum_clients = " +
         std::to_string(clients) + "\n[model]\narch = \"EXTERNAL\"\nweights = \"" +
         (d / "linreg.safetensors").string() + "\"\neval_command = [\"python3\", \"" + py +
         "\"]\n[eval]\nevery_rounds = 1\n"
         "[client]\ntrainer = \"exec\"\ntrainer_command = [\"python3\", \"" +
         py + "\"]\ntrainer_timeout_s = " + std::to_string(timeout_s) + "\n";
}

}  // namespace

TEST_CASE("cli: exec trainer in client processes over mutual TLS, a crash and a hang cost a round",
          "[apps]") {
  const fs::path d = fresh_dir("starling_exec_cli");
  REQUIRE(starling::testing::run_shell("python3 " + kExamples + "/exec_protocol/make_weights.py " +
                                       (d / "linreg.safetensors").string())
              .rc == 0);
  starling::testing::make_cli_pki(d, {"client-0", "client-1"}, "exec-test");
  const int port = starling::testing::test_port(4099);
  const std::string common = linreg_config(d, 2, 5, 2);
  std::ofstream(d / "agg.toml") << starling::testing::aggregator_tls_toml(d)
                                << "[server]\nport = " << port << "\nstate_dir = \""
                                << (d / "state").string() << "\"\n"
                                << common;
  std::vector<std::string> client_args;
  for (int k = 0; k < 2; ++k) {
    const std::string name = "client-" + std::to_string(k);
    const fs::path cfg = d / (name + ".toml");
    std::ofstream(cfg) << starling::testing::client_tls_toml(d, name) << common
                       << "server_port = " << port
                       << "\nserver_name = \"localhost\"\nbackoff_max_ms = 300\npartition_index = "
                       << k << "\nstate_path = \"" << (d / (name + ".state")).string()
                       << "\"\ntrainer_dir = \"" << (d / (name + ".trainer")).string() << "\"\n";
    client_args.push_back("client --config " + cfg.string());
  }
  // The check finds the trainer program and the model's tensors.
  const auto check = run(client_args[0] + " --check --check-timeout 1");
  INFO(check.out);
  CHECK_THAT(check.out, Catch::Contains("ok    trainer") &&
                            Catch::Contains("exec trainer `python3 ") &&
                            Catch::Contains("2 tensors, 5 parameters"));

  ChildProcess agg = spawn("aggregator --config " + (d / "agg.toml").string(), d / "agg.log");
  REQUIRE(starling::testing::wait_for_text(d / "agg.log", "listening"));
  // client-0's trainer crashes in round 2; client-1's hangs past the 2 s deadline in round 3.
  ChildProcess c0 = ChildProcess::shell("env STARLING_TEST_FAIL=crash@2:0 " +
                                        starling::testing::starling_binary() + " " +
                                        client_args[0] + " >" + (d / "c0.log").string() + " 2>&1");
  ChildProcess c1 = ChildProcess::shell("env STARLING_TEST_FAIL=hang@3:1 " +
                                        starling::testing::starling_binary() + " " +
                                        client_args[1] + " >" + (d / "c1.log").string() + " 2>&1");
  const int agg_rc = agg.wait_or_kill(seconds(120));
  const int c0_rc = c0.wait_or_kill(seconds(30));
  const int c1_rc = c1.wait_or_kill(seconds(30));
  const std::string agg_log = slurp(d / "agg.log");
  const std::string c0_log = slurp(d / "c0.log");
  const std::string c1_log = slurp(d / "c1.log");
  INFO(agg_log);
  INFO(c0_log);
  INFO(c1_log);
  CHECK(agg_rc == 0);
  CHECK(c0_rc == 0);
  CHECK(c1_rc == 0);
  // Each failure is in the client's log and the aggregator's, with the reason.
  CHECK_THAT(c0_log, Catch::Contains("round 2 lost") && Catch::Contains("exited with status 3") &&
                         Catch::Contains("crashing on purpose"));
  CHECK_THAT(c1_log, Catch::Contains("round 3 lost") &&
                         Catch::Contains("did not finish within trainer_timeout_s = 2 s"));
  CHECK_THAT(agg_log, Catch::Contains("error from client-0: round 2 lost") &&
                          Catch::Contains("error from client-1: round 3 lost") &&
                          Catch::Contains("1 lost by their trainers"));
  CHECK_THAT(agg_log, Catch::Contains("federation complete after 5 rounds"));
  // The round records count them.
  const std::string metrics = slurp(d / "state" / "metrics.jsonl");
  CHECK_THAT(metrics, Catch::Contains("\"lost_by_clients\":1"));
  // And the federation learned: the evaluator's loss falls from ~15 to near the noise floor.
  const auto losses = test_losses(agg_log);
  REQUIRE(losses.size() >= 4);
  CHECK(losses.back() < 0.2 * losses.front());
  CHECK(losses.back() < 0.5);
  fs::remove_all(d);
}

TEST_CASE("cli: exec trainer configs: mistakes are named before anything runs", "[apps]") {
  const fs::path d = fresh_dir("starling_exec_cfg");
  REQUIRE(starling::testing::run_shell("python3 " + kExamples + "/exec_protocol/make_weights.py " +
                                       (d / "w.safetensors").string())
              .rc == 0);
  auto try_config = [&](const std::string& name, const std::string& text) {
    std::ofstream(d / name) << text;
    return run("aggregator --simulate --config " + (d / name).string());
  };
  const auto no_exec =
      try_config("a.toml", "[model]\narch = \"EXTERNAL\"\nweights = \"" +
                               (d / "w.safetensors").string() + "\"\n[eval]\nevery_rounds = 0\n");
  CHECK(no_exec.rc != 0);
  CHECK_THAT(no_exec.out, Catch::Contains("client.trainer") && Catch::Contains("\"exec\""));
  const auto no_eval = try_config(
      "b.toml", "[model]\narch = \"EXTERNAL\"\nweights = \"" + (d / "w.safetensors").string() +
                    "\"\n[client]\ntrainer = \"exec\"\ntrainer_command = [\"true\"]\n");
  CHECK_THAT(no_eval.out,
             Catch::Contains("eval.every_rounds") && Catch::Contains("model.eval_command"));
  const auto no_file = try_config(
      "c.toml", "[model]\narch = \"EXTERNAL\"\nweights = \"" + (d / "nope.safetensors").string() +
                    "\"\n[eval]\nevery_rounds = 0\n[client]\ntrainer = \"exec\"\n"
                    "trainer_command = [\"true\"]\n");
  CHECK(no_file.rc != 0);
  CHECK_THAT(no_file.out, Catch::Contains("model.weights") && Catch::Contains("nope.safetensors"));
  const auto no_command =
      try_config("d.toml", "[client]\ntrainer = \"exec\"\n[eval]\nevery_rounds = 0\n");
  CHECK_THAT(no_command.out, Catch::Contains("client.trainer_command"));
  fs::remove_all(d);
}

TEST_CASE("cli: the PyTorch example trains rounds through the exec trainer", "[apps]") {
  if (starling::testing::run_shell("python3 -c 'import torch'", seconds(120)).rc != 0) {
    WARN(
        "skipped: python3 cannot import torch here (examples/pytorch_client needs PyTorch; "
        "the exec protocol itself is tested with examples/exec_protocol/linreg.py)");
    return;
  }
  const fs::path d = fresh_dir("starling_exec_torch");
  REQUIRE(starling::testing::run_shell("python3 " + kExamples + "/pytorch_client/make_weights.py " +
                                       (d / "mlp.safetensors").string())
              .rc == 0);
  // The example's config, pointed at this test's folders.
  std::string cfg = slurp(kExamples + "/pytorch_client/federation.toml");
  auto replace = [&](const std::string& from, const std::string& to) {
    const auto at = cfg.find(from);
    REQUIRE(at != std::string::npos);
    cfg.replace(at, from.size(), to);
  };
  replace("runs/pytorch_client", (d / "state").string());
  replace("runs/torch_mlp.safetensors", (d / "mlp.safetensors").string());
  replace("tests/fixtures/data/mnist",
          std::string(STARLING_SOURCE_DIR) + "/tests/fixtures/data/mnist");
  for (int i = 0; i < 2; ++i)
    replace("\"examples/pytorch_client/train.py\"",
            "\"" + kExamples + "/pytorch_client/train.py\"");
  std::ofstream(d / "torch.toml") << cfg;
  const auto r = starling::testing::run_shell(
      starling::testing::starling_binary() + " aggregator --simulate --num-rounds 2 --config " +
          (d / "torch.toml").string() + " 2>&1",
      std::chrono::minutes(5));
  INFO(r.out);
  CHECK(r.rc == 0);
  CHECK_THAT(r.out, Catch::Contains("federation complete after 2 rounds"));
  static const std::regex acc("test accuracy ([0-9.]+)");
  std::vector<double> accuracy;
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), acc);
       it != std::sregex_iterator(); ++it) {
    accuracy.push_back(std::stod((*it)[1]));
  }
  REQUIRE(accuracy.size() == 2);
  CHECK(accuracy.back() > 0.5);  // 10 classes: chance is 0.1
  fs::remove_all(d);
}
