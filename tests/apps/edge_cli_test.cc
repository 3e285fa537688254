// An edge device's life from the command line: certificates from `starling certs`, a config,
// `starling client --check` before and after the aggregator is up, then a client killed with
// SIGKILL during local training and restarted: its state file is intact, it rejoins, and the
// federation completes.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/child_process.h"
#include "tests/testing/cli_federation.h"

namespace fs = std::filesystem;

namespace {

const std::string& kBinary = starling::testing::starling_binary();
// The small cut of MNIST that ships in the repository: these tests run from a bare clone.
const std::string kFixtureData =
    "data_dir = \"" + std::string(STARLING_SOURCE_DIR) + "/tests/fixtures/data\"\n";

using starling::testing::ChildProcess;
using std::chrono::seconds;

using Run = starling::testing::CommandResult;
constexpr auto run = starling::testing::run_starling;
constexpr auto spawn = starling::testing::spawn_starling;

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("cli: client --check, SIGKILL during training, restart and rejoin", "[apps]") {
  const fs::path d = fs::temp_directory_path() / ("starling_edge_cli_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  REQUIRE(run("certs init-ca --out " + (d / "ca").string() + " --name edge-test").rc == 0);
  REQUIRE(run("certs issue --ca " + (d / "ca").string() +
              " --name aggregator --role server --san DNS:localhost,IP:127.0.0.1 --out " +
              (d / "agg").string())
              .rc == 0);
  REQUIRE(run("certs issue --ca " + (d / "ca").string() + " --name client-0 --role client --out " +
              (d / "c0").string())
              .rc == 0);
  // A free port: bind port 0 would race; pick one from the pid instead.
  const int port = starling::testing::test_port(0);
  const std::string common =
      "[rounds]\nnum_rounds = 3\nclients_per_round = 1\nmin_available = 1\n"
      "round_deadline_ms = 5000\n"
      "[local]\nepochs = 1\nlocal_steps = 1500\nbatch_size = 10\nlearning_rate = 0.05\n"
      "codec = \"topk:ratio=0.05,ef=1\"\n"
      "[data]\ndataset = \"mnist\"\nnum_clients = 20\npartition = \"IID\"\n" +
      kFixtureData + "[model]\nhidden = 32\n[eval]\nevery_rounds = 0\n";
  std::ofstream(d / "agg.toml") << "[tls]\nca = \"" << (d / "agg" / "ca.crt").string()
                                << "\"\ncert = \"" << (d / "agg" / "aggregator.crt").string()
                                << "\"\nkey = \"" << (d / "agg" / "aggregator.key").string()
                                << "\"\n[server]\nport = " << port << "\nstate_dir = \""
                                << (d / "state").string() << "\"\n"
                                << common;
  const fs::path state = d / "client-0.state.safetensors";
  std::ofstream(d / "client.toml")
      << "[tls]\nca = \"" << (d / "c0" / "ca.crt").string() << "\"\ncert = \""
      << (d / "c0" / "client-0.crt").string() << "\"\nkey = \""
      << (d / "c0" / "client-0.key").string() << "\"\n"
      << common << "[client]\nserver_port = " << port
      << "\nserver_name = \"localhost\"\npartition_index = 4\n"
      << "memory_limit_mb = 2048\nbackoff_max_ms = 500\n"
      << "state_path = \"" << state.string() << "\"\n";
  const std::string client_args = "client --config " + (d / "client.toml").string();

  // No aggregator yet: everything but the link checks out.
  auto check = run(client_args + " --check --check-timeout 2");
  INFO(check.out);
  CHECK(check.rc == 1);
  CHECK_THAT(check.out, Catch::Contains("ok    certificate   CN=client-0"));
  CHECK_THAT(check.out, Catch::Contains("ok    data"));
  CHECK_THAT(check.out, Catch::Contains("ok    memory"));
  // What GPUs this machine and build offer (none here: no GPU, or a CPU build).
  CHECK_THAT(check.out, Catch::Contains("ok    gpu") && Catch::Contains("trains on the CPU"));
  CHECK_THAT(check.out, Catch::Contains("FAIL  aggregator"));
  CHECK_THAT(check.out, Catch::Contains("1 check(s) failed"));

  ChildProcess agg = spawn("aggregator --config " + (d / "agg.toml").string(), d / "agg.log");
  REQUIRE(starling::testing::wait_for_text(d / "agg.log", "listening"));
  check = run(client_args + " --check");
  INFO(check.out);
  CHECK(check.rc == 0);
  CHECK_THAT(check.out, Catch::Contains("aggregator aggregator at 127.0.0.1"));

  // Kill the client as soon as its first update is acknowledged: it is then training round 2.
  ChildProcess client = spawn("--log-level info " + client_args, d / "client1.log");
  bool saved = false;
  for (int i = 0; i < 600 && !saved; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    saved = fs::exists(state);
  }
  REQUIRE(saved);
  client.kill();
  CHECK(client.term_signal() == SIGKILL);

  check = run(client_args + " --check");
  INFO(check.out);
  CHECK(check.rc == 0);
  CHECK_THAT(check.out, Catch::Contains("ok    state"));
  CHECK_THAT(check.out, Catch::Contains("1 rounds trained"));

  client = spawn("--log-level info " + client_args, d / "client2.log");
  const int client_rc = client.wait_or_kill(seconds(120));
  const int agg_rc = agg.wait_or_kill(seconds(30));
  INFO(slurp(d / "client2.log"));
  INFO(slurp(d / "agg.log"));
  CHECK(client_rc == 0);
  CHECK(agg_rc == 0);
  CHECK_THAT(slurp(d / "client2.log"), Catch::Contains("resumed from"));
  check = run(client_args + " --check --check-timeout 1");
  CHECK_THAT(check.out, Catch::Contains("3 rounds trained"));
  fs::remove_all(d);
}

TEST_CASE("cli: allow-list and `certs revoke` + SIGHUP refuse clients of a live aggregator",
          "[apps]") {
  const fs::path d = fs::temp_directory_path() / "access";
  fs::create_directories(d);
  const std::string ca = (d / "ca").string();
  REQUIRE(run("certs init-ca --out " + ca + " --name access-test").rc == 0);
  REQUIRE(run("certs issue --ca " + ca +
              " --name aggregator --role server --san DNS:localhost,IP:127.0.0.1 --out " +
              (d / "agg").string())
              .rc == 0);
  for (const char* name : {"client-0", "client-1"}) {
    REQUIRE(run(std::string("certs issue --ca ") + ca + " --name " + name +
                " --role client --out " + (d / name).string())
                .rc == 0);
  }
  auto empty = run("certs revoke --ca " + ca);  // an empty list to start from
  INFO(empty.out);
  REQUIRE(empty.rc == 0);
  CHECK_THAT(empty.out, Catch::Contains("0 revoked certificate(s)"));
  std::ofstream(d / "allowed.txt") << "# who may join\nclient-0\n";

  const int port = starling::testing::test_port(7919);
  const std::string common =
      "[rounds]\nnum_rounds = 1000\nclients_per_round = 1\nmin_available = 1\n"
      "round_deadline_ms = 5000\n"
      "[local]\nepochs = 1\nlocal_steps = 2\nbatch_size = 10\nlearning_rate = 0.05\n"
      "[data]\ndataset = \"mnist\"\nnum_clients = 20\npartition = \"IID\"\n" +
      kFixtureData + "[model]\nhidden = 16\n[eval]\nevery_rounds = 0\n";
  std::ofstream(d / "agg.toml") << "[tls]\nca = \"" << (d / "agg" / "ca.crt").string()
                                << "\"\ncert = \"" << (d / "agg" / "aggregator.crt").string()
                                << "\"\nkey = \"" << (d / "agg" / "aggregator.key").string()
                                << "\"\ncrl = \"" << (d / "ca" / "crl.pem").string()
                                << "\"\n[server]\nport = " << port << "\nstate_dir = \""
                                << (d / "state").string() << "\"\nallowed_clients_file = \""
                                << (d / "allowed.txt").string() << "\"\n"
                                << common;
  for (const char* name : {"client-0", "client-1"}) {
    const fs::path dir = d / name;
    std::ofstream(d / (std::string(name) + ".toml"))
        << "[tls]\nca = \"" << (dir / "ca.crt").string() << "\"\ncert = \""
        << (dir / (std::string(name) + ".crt")).string() << "\"\nkey = \""
        << (dir / (std::string(name) + ".key")).string() << "\"\n"
        << common << "[client]\nserver_port = " << port
        << "\nserver_name = \"localhost\"\npartition_index = 1\nbackoff_max_ms = 300\n"
        << "state_path = \"none\"\n";
  }
  ChildProcess agg =
      spawn("--log-level info aggregator --config " + (d / "agg.toml").string(), d / "agg.log");
  auto log_has = [&](const std::string& text) {
    return slurp(d / "agg.log").find(text) != std::string::npos;
  };
  auto wait_log = [&](const std::string& text, std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!log_has(text)) {
      if (std::chrono::steady_clock::now() > end || !agg.running()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  };
  REQUIRE(wait_log("listening", seconds(10)));
  ChildProcess c0 = spawn("--log-level info client --config " + (d / "client-0.toml").string(),
                          d / "client-0.log");
  ChildProcess c1 = spawn("--log-level info client --config " + (d / "client-1.toml").string(),
                          d / "client-1.log");
  INFO(slurp(d / "agg.log"));
  // Off the allow-list: refused with its name.
  CHECK(wait_log("client-1 is not on the allow-list", seconds(30)));
  REQUIRE(wait_log("round 2 closed", seconds(60)));  // client-0 trains

  auto rev =
      run("certs revoke --ca " + ca + " --cert " + (d / "client-0" / "client-0.crt").string());
  INFO(rev.out);
  REQUIRE(rev.rc == 0);
  CHECK_THAT(rev.out, Catch::Contains("revoked") && Catch::Contains("CN=client-0"));
  CHECK_THAT(rev.out, Catch::Contains("1 revoked certificate(s) (1 new)"));
  const auto t0 = std::chrono::steady_clock::now();
  agg.signal(SIGHUP);
  REQUIRE(wait_log("closing the session of client-0", seconds(5)));
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(took < seconds(1));
  // Its reconnects now fail at the TLS handshake, the refusal naming it.
  const bool refused = wait_log("certificate revoked, CN=client-0", seconds(10));
  {
    INFO("aggregator log now:\n" << slurp(d / "agg.log"));  // what it said, should it be gone
    CHECK(refused);
    CHECK(agg.running());
  }
  // Revoking it again changes nothing.
  auto again =
      run("certs revoke --ca " + ca + " --cert " + (d / "client-0" / "client-0.crt").string());
  CHECK_THAT(again.out, Catch::Contains("already revoked"));
  CHECK_THAT(run("certs revoke --ca " + ca + " --serial XYZ").out,
             Catch::Contains("not a hexadecimal number"));
}

// Writes a CA, an aggregator and `clients` client certificates under `d`, and the configs of a
// federation on `port` (agg.toml, client-K.toml) with `common` keys; `client_keys` end each
// client's [client] table.
void write_federation(const fs::path& d, int port, int clients, const std::string& common,
                      const std::string& client_keys = "state_path = \"none\"\n") {
  const std::string ca = (d / "ca").string();
  REQUIRE(run("certs init-ca --out " + ca + " --name crash-test").rc == 0);
  REQUIRE(run("certs issue --ca " + ca +
              " --name aggregator --role server --san DNS:localhost,IP:127.0.0.1 --out " +
              (d / "agg").string())
              .rc == 0);
  std::ofstream(d / "agg.toml") << "[tls]\nca = \"" << (d / "agg" / "ca.crt").string()
                                << "\"\ncert = \"" << (d / "agg" / "aggregator.crt").string()
                                << "\"\nkey = \"" << (d / "agg" / "aggregator.key").string()
                                << "\"\n[server]\nport = " << port << "\nstate_dir = \""
                                << (d / "state").string() << "\"\n"
                                << common;
  for (int k = 0; k < clients; ++k) {
    const std::string name = "client-" + std::to_string(k);
    const fs::path dir = d / name;
    REQUIRE(
        run("certs issue --ca " + ca + " --name " + name + " --role client --out " + dir.string())
            .rc == 0);
    std::ofstream(d / (name + ".toml"))
        << "[tls]\nca = \"" << (dir / "ca.crt").string() << "\"\ncert = \""
        << (dir / (name + ".crt")).string() << "\"\nkey = \"" << (dir / (name + ".key")).string()
        << "\"\n"
        << common << "[client]\nserver_port = " << port << "\nserver_name = \"localhost\"\n"
        << "partition_index = " << k << "\nbackoff_max_ms = 200\n"
        << client_keys;
  }
}

TEST_CASE("cli: SIGKILL of the aggregator at every stage of a round, ten times, loses nothing",
          "[apps]") {
  const std::string common =
      "[rounds]\nnum_rounds = 6\nclients_per_round = 1\nmin_available = 2\n"
      "round_deadline_ms = 20000\nseed = 3\n"
      "[local]\nepochs = 1\nlocal_steps = 3\nbatch_size = 10\nlearning_rate = 0.05\n"
      "[data]\ndataset = \"mnist\"\nnum_clients = 20\npartition = \"IID\"\n" +
      kFixtureData + "[model]\nhidden = 16\n[eval]\nevery_rounds = 0\n";
  // One federation run: aggregator restarted after each crash point, clients kept running.
  auto federate = [&](const std::string& name, const std::vector<std::string>& crashes) {
    const fs::path d = fs::temp_directory_path() / name;
    fs::create_directories(d);
    const int port = starling::testing::test_port(static_cast<int>(name.size()) * 131 + 3001);
    write_federation(d, port, 2, common);
    std::vector<ChildProcess> clients;
    for (int k = 0; k < 2; ++k) {
      clients.push_back(spawn("--log-level info client --config " +
                                  (d / ("client-" + std::to_string(k) + ".toml")).string(),
                              d / ("client-" + std::to_string(k) + ".log")));
    }
    const std::string agg_args =
        "--log-level info aggregator --config " + (d / "agg.toml").string();
    for (size_t i = 0; i <= crashes.size(); ++i) {
      const bool last = i == crashes.size();
      const std::string env = last ? "" : "env STARLING_CRASH_POINT=" + crashes[i] + " ";
      ChildProcess agg = ChildProcess::shell(env + kBinary + " " + agg_args + " >>" +
                                             (d / "agg.log").string() + " 2>&1");
      const int rc = agg.wait_or_kill(seconds(60));
      INFO(name << ": run " << i << (last ? " (to the end)" : ", crash point " + crashes[i]) << "\n"
                << slurp(d / "agg.log"));
      if (last) {
        REQUIRE(rc == 0);
      } else {
        REQUIRE(rc == -1);  // killed by itself at the crash point, not finished
        REQUIRE(agg.term_signal() == SIGKILL);
      }
    }
    for (auto& c : clients) CHECK(c.wait_or_kill(seconds(30)) == 0);
    const std::string log = slurp(d / "agg.log");
    size_t kills = 0;
    size_t resumes = 0;
    for (size_t at = 0; (at = log.find("SIGKILL", at)) != std::string::npos; ++at) ++kills;
    for (size_t at = 0; (at = log.find("resumed from", at)) != std::string::npos; ++at) ++resumes;
    CHECK(kills == crashes.size());
    // Every restart after a round was checkpointed resumes from it.
    if (!crashes.empty()) CHECK(resumes + 2 >= crashes.size());
    CHECK_THAT(log, Catch::Contains("federation complete after 6 rounds"));
    return slurp(d / "state" / "global_model.safetensors");
  };
  const std::string reference = federate("uninterrupted", {});
  REQUIRE(reference.size() > 1000);
  const std::vector<std::string> crashes = {
      "selecting@1", "collecting@1", "folding@2",    "stepped@2", "writing@3",
      "closed@3",    "selecting@4",  "collecting@5", "writing@5", "stepped@6"};
  const std::string crashed = federate("crashed", crashes);
  CHECK(crashed.size() == reference.size());
  CHECK(crashed == reference);  // bit for bit
}

TEST_CASE(
    "cli: secure aggregation, the aggregator SIGKILLed between its stages: each round restarts "
    "with fresh keys and the final model is bit-identical",
    "[apps][secagg]") {
  // Without error feedback a client's masked vector depends only on the model and the round,
  // so a round restarted with fresh keys and masks sums to the same integers.
  const std::string common =
      "[rounds]\nnum_rounds = 3\nclients_per_round = 3\nmin_available = 3\n"
      "round_deadline_ms = 20000\nseed = 4\n"
      "[local]\nepochs = 1\nlocal_steps = 3\nbatch_size = 10\nlearning_rate = 0.05\n"
      "[data]\ndataset = \"mnist\"\nnum_clients = 20\npartition = \"IID\"\n" +
      kFixtureData +
      "[model]\nhidden = 16\n[eval]\nevery_rounds = 0\n"
      "[secagg]\nenabled = true\nerror_feedback = false\nstage_timeout_ms = 5000\n";
  auto federate = [&](const std::string& name, const std::vector<std::string>& crashes) {
    const fs::path d = fs::temp_directory_path() / name;
    fs::remove_all(d);
    fs::create_directories(d);
    const int port = starling::testing::test_port(static_cast<int>(name.size()) * 173 + 5003);
    write_federation(d, port, 3, common);
    std::vector<ChildProcess> clients;
    for (int k = 0; k < 3; ++k) {
      clients.push_back(spawn("--log-level info client --config " +
                                  (d / ("client-" + std::to_string(k) + ".toml")).string(),
                              d / ("client-" + std::to_string(k) + ".log")));
    }
    for (size_t i = 0; i <= crashes.size(); ++i) {
      const bool last = i == crashes.size();
      const std::string env = last ? "" : "env STARLING_CRASH_POINT=" + crashes[i] + " ";
      ChildProcess agg = ChildProcess::shell(
          env + kBinary + " --log-level info aggregator --config " + (d / "agg.toml").string() +
          " >>" + (d / "agg.log").string() + " 2>&1");
      const int rc = agg.wait_or_kill(seconds(60));
      INFO(name << ": run " << i << "\n" << slurp(d / "agg.log"));
      if (last) {
        REQUIRE(rc == 0);
      } else {
        REQUIRE(agg.term_signal() == SIGKILL);
      }
    }
    for (auto& c : clients) CHECK(c.wait_or_kill(seconds(30)) == 0);
    const std::string log = slurp(d / "agg.log");
    CHECK_THAT(log, Catch::Contains("federation complete after 3 rounds"));
    CHECK_THAT(log, Catch::Contains("secure aggregation: 3 survivors, 0 dropped"));
    CHECK_THAT(slurp(d / "state" / "metrics.jsonl"), Catch::Contains("\"secagg_survivors\":3"));
    // What the aggregator keeps on disk: the global model, its checkpoint and the round metrics,
    // nothing of a client's (masked vectors live in memory, or in unlinked spill files).
    for (const auto& entry : fs::recursive_directory_iterator(d / "state")) {
      if (!entry.is_regular_file()) continue;
      const std::string file = entry.path().filename().string();
      INFO(entry.path().string());
      CHECK((file == "global_model.safetensors" || file == "state.safetensors" ||
             file == "model.safetensors" || file == "metrics.jsonl"));
    }
    return slurp(d / "state" / "global_model.safetensors");
  };
  const std::string reference = federate("secagg_uninterrupted", {});
  REQUIRE(reference.size() > 1000);
  const std::string crashed = federate(
      "secagg_crashed", {"secagg-keys@1", "secagg-masked@2", "secagg-unmask@2", "secagg-unmask@3"});
  CHECK(crashed == reference);  // bit for bit
}

TEST_CASE("cli: SIGKILL of a client mid-upload, restarted: the final model is bit-identical",
          "[apps]") {
  // One client, top-k with error feedback: the residual it carries into each round is part of
  // the model, so a restart must resume from the state of its last acknowledged update.
  const std::string common =
      "[rounds]\nnum_rounds = 4\nclients_per_round = 1\nmin_available = 1\n"
      "round_deadline_ms = 20000\nseed = 5\n"
      "[local]\nepochs = 1\nlocal_steps = 4\nbatch_size = 10\nlearning_rate = 0.05\n"
      "codec = \"topk:ratio=0.1,ef=1\"\n"
      "[data]\ndataset = \"mnist\"\nnum_clients = 20\npartition = \"IID\"\n" +
      kFixtureData + "[model]\nhidden = 64\n[eval]\nevery_rounds = 0\n";
  // About 40 KB per update in 4 KiB chunks at 40 kB/s: an upload takes a second.
  auto federate = [&](const std::string& name, bool crash, bool keep_state) {
    const fs::path d = fs::temp_directory_path() / name;
    fs::create_directories(d);
    const int port = starling::testing::test_port(static_cast<int>(name.size()) * 257 + 7001);
    const std::string state = keep_state
                                  ? "state_path = \"" + (d / "client-0.state").string() + "\"\n"
                                  : "state_path = \"none\"\n";
    write_federation(d, port, 1, common, state + "chunk_kb = 4\nupload_limit_kbps = 40\n");
    ChildProcess agg =
        spawn("--log-level info aggregator --config " + (d / "agg.toml").string(), d / "agg.log");
    const std::string client_args =
        "--log-level info client --config " + (d / "client-0.toml").string();
    if (crash) {
      ChildProcess first =
          ChildProcess::shell("env STARLING_CRASH_POINT=uploading@2 " + kBinary + " " +
                              client_args + " >>" + (d / "client.log").string() + " 2>&1");
      first.wait_or_kill(seconds(60));
      INFO(slurp(d / "client.log"));
      REQUIRE(first.term_signal() == SIGKILL);
      CHECK_THAT(slurp(d / "client.log"), Catch::Contains("crash point uploading@2"));
    }
    ChildProcess client = ChildProcess::shell(kBinary + " " + client_args + " >>" +
                                              (d / "client.log").string() + " 2>&1");
    const int client_rc = client.wait_or_kill(seconds(60));
    const int agg_rc = agg.wait_or_kill(seconds(30));
    INFO(name << "\n" << slurp(d / "client.log") << slurp(d / "agg.log"));
    REQUIRE(client_rc == 0);
    REQUIRE(agg_rc == 0);
    const std::string log = slurp(d / "agg.log");
    CHECK_THAT(log, Catch::Contains("federation complete after 4 rounds"));
    if (crash) CHECK_THAT(log, Catch::Contains("round 2 failed"));  // the cut upload: no update
    return slurp(d / "state" / "global_model.safetensors");
  };
  const std::string reference = federate("upload_whole", false, true);
  REQUIRE(reference.size() > 1000);
  const std::string resumed = federate("upload_cut", true, true);
  CHECK(resumed == reference);  // bit for bit
  // Without its state the restarted client loses its residual: the model differs, so the
  // comparison above can fail.
  const std::string forgetful = federate("upload_cut_no_state", true, false);
  CHECK(forgetful.size() == reference.size());
  CHECK(forgetful != reference);
}

TEST_CASE("cli: a client on its own data ([data] path): checked, and errors name file and line",
          "[apps]") {
  const fs::path d = fs::temp_directory_path() / "own_data";
  fs::create_directories(d);
  REQUIRE(run("certs init-ca --out " + (d / "ca").string() + " --name own-data").rc == 0);
  REQUIRE(run("certs issue --ca " + (d / "ca").string() + " --name client-0 --role client --out " +
              (d / "c0").string())
              .rc == 0);
  std::ofstream(d / "own.jsonl") << "{\"text\": \"ROMEO:\\nWhat light through yonder window "
                                    "breaks?\\n\"}\n{\"text\": \"JULIET:\\nAy me!\\n\"}\n";
  std::ofstream(d / "bad.jsonl") << "{\"text\": \"ROMEO:\\nfine\"}\n{\"text\": \"caf\\u00e9\"}\n";
  auto config = [&](const std::string& own) {
    const fs::path p = d / ("client-" + own + ".toml");
    std::ofstream(p) << "[tls]\nca = \"" << (d / "c0" / "ca.crt").string() << "\"\ncert = \""
                     << (d / "c0" / "client-0.crt").string() << "\"\nkey = \""
                     << (d / "c0" / "client-0.key").string() << "\"\n"
                     << "[data]\ndataset = \"shakespeare\"\npartition = \"ROLES\"\n"
                     << kFixtureData << "path = \"" << (d / own).string() << "\"\n"
                     << "[model]\narch = \"GPT\"\nn_layer = 1\nn_head = 1\nn_embd = 16\n"
                     << "block_size = 16\n[client]\nserver_port = 1\nstate_path = \"none\"\n";
    return p;
  };
  auto good = run("client --config " + config("own.jsonl").string() + " --check --check-timeout 1");
  INFO(good.out);
  CHECK_THAT(good.out, Catch::Contains("ok    data") && Catch::Contains("own.jsonl") &&
                           Catch::Contains("never uploaded"));
  auto bad = run("client --config " + config("bad.jsonl").string() + " --check --check-timeout 1");
  INFO(bad.out);
  CHECK(bad.rc == 1);
  CHECK_THAT(bad.out, Catch::Contains("FAIL  data") && Catch::Contains("bad.jsonl:2: character"));
  auto none =
      run("client --config " + config("missing.txt").string() + " --check --check-timeout 1");
  CHECK_THAT(none.out, Catch::Contains("FAIL  data") && Catch::Contains("missing.txt"));
}
