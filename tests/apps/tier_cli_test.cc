// Aggregator tiers from the command line, every node its own process over mutual TLS: a root,
// three `starling aggregator` leaves ([upstream], certificates of role leaf) and twelve
// `starling client`s. Two tiers give the flat federation's model within 1e-6; a leaf killed
// with SIGKILL mid-round costs the root only its clients' updates for that round, and the
// restarted leaf rejoins with its clients; a leaf config with a client certificate is refused.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing/child_process.h"
#include "tests/testing/cli_federation.h"

namespace fs = std::filesystem;

namespace {

using starling::testing::ChildProcess;
using starling::testing::slurp_file;
using std::chrono::seconds;
constexpr auto run = starling::testing::run_starling;
constexpr auto spawn = starling::testing::spawn_starling;

constexpr int kLeaves = 3;
constexpr int kClientsPerLeaf = 4;
constexpr int kClients = kLeaves * kClientsPerLeaf;

const std::string kCommon =
    "[local]\nlocal_steps = 6\nbatch_size = 10\nlearning_rate = 0.05\ncodec = \"identity\"\n"
    "[data]\ndataset = \"mnist\"\nnum_clients = 12\npartition = \"IID\"\ndata_dir = \"" +
    std::string(STARLING_SOURCE_DIR) + "/tests/fixtures/data\"\n[model]\nhidden = 16\n" +
    "[eval]\nevery_rounds = 0\n";

std::string rounds_toml(int rounds, int contributors, int min_updates) {
  return "[rounds]\nnum_rounds = " + std::to_string(rounds) +
         "\nclients_per_round = " + std::to_string(contributors) +
         "\nmin_available = " + std::to_string(contributors) +
         "\nmin_updates = " + std::to_string(min_updates) +
         "\nround_deadline_ms = 60000\nseed = 3\n";
}

std::string tls_toml(const fs::path& dir, const std::string& name) {
  return "[tls]\nca = \"" + (dir / "ca.crt").string() + "\"\ncert = \"" +
         (dir / (name + ".crt")).string() + "\"\nkey = \"" + (dir / (name + ".key")).string() +
         "\"\n";
}

std::string server_toml(int port, const fs::path& state, const std::string& node_id) {
  return "[server]\nport = " + std::to_string(port) + "\nstate_dir = \"" + state.string() +
         "\"\nnode_id = \"" + node_id + "\"\n";
}

void issue(const fs::path& d, const std::string& name, const std::string& role) {
  REQUIRE(run("certs issue --ca " + (d / "ca").string() + " --name " + name + " --role " + role +
              " --san DNS:localhost,IP:127.0.0.1 --out " + (d / name).string())
              .rc == 0);
}

// The float32 values of a global_model.safetensors (header checked equal to `like`'s when given).
std::vector<float> model_values(const fs::path& file) {
  const std::string bytes = slurp_file(file);
  REQUIRE(bytes.size() > 8);
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  REQUIRE(8 + header <= bytes.size());
  std::vector<float> v((bytes.size() - 8 - header) / 4);
  std::memcpy(v.data(), bytes.data() + 8 + header, v.size() * 4);
  return v;
}

std::vector<nlohmann::json> metrics(const fs::path& file) {
  std::vector<nlohmann::json> rows;
  std::istringstream in(slurp_file(file));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  }
  return rows;
}

struct Federation {
  fs::path d;
  int root_port;
  std::vector<int> leaf_ports;

  explicit Federation(const std::string& name, int salt) {
    d = fs::temp_directory_path() / (name + "_" + std::to_string(getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    REQUIRE(run("certs init-ca --out " + (d / "ca").string() + " --name tier-test").rc == 0);
    issue(d, "aggregator", "server");
    for (int l = 0; l < kLeaves; ++l) issue(d, "leaf-" + std::to_string(l), "leaf");
    for (int k = 0; k < kClients; ++k) issue(d, "client-" + std::to_string(k), "client");
    root_port = starling::testing::test_port(salt);
    for (int l = 0; l < kLeaves; ++l)
      leaf_ports.push_back(starling::testing::test_port(salt + 1 + l));
  }
  ~Federation() { fs::remove_all(d); }

  fs::path config(const std::string& name) const { return d / (name + ".toml"); }

  void write_root(int rounds, int contributors, int min_updates) const {
    std::ofstream(config("root")) << tls_toml(d / "aggregator", "aggregator")
                                  << server_toml(root_port, d / "root_state", "aggregator")
                                  << rounds_toml(rounds, contributors, min_updates) << kCommon;
  }
  void write_leaf(int l) const {
    const std::string name = "leaf-" + std::to_string(l);
    std::ofstream(config(name)) << tls_toml(d / name, name)
                                << server_toml(leaf_ports[static_cast<size_t>(l)],
                                               d / (name + "_state"), name)
                                << rounds_toml(1, kClientsPerLeaf, kClientsPerLeaf) << kCommon
                                << "[upstream]\nport = " << root_port
                                << "\nserver_name = \"localhost\"\nbackoff_max_ms = 200\n";
  }
  // Client k connects to `port`.
  void write_client(int k, int port) const {
    const std::string name = "client-" + std::to_string(k);
    std::ofstream(config(name)) << tls_toml(d / name, name) << kCommon
                                << "[client]\nserver_port = " << port
                                << "\nserver_name = \"localhost\"\npartition_index = " << k
                                << "\nbackoff_max_ms = 200\nstate_path = \"none\"\n";
  }

  ChildProcess start(const std::string& name, const std::string& command,
                     const std::string& env = "") const {
    if (env.empty()) {
      return spawn("--log-level info " + command + " --config " + config(name).string(),
                   d / (name + ".log"));
    }
    return ChildProcess::shell(
        "env " + env + " " + starling::testing::starling_binary() + " --log-level info " + command +
        " --config " + config(name).string() + " >>" + (d / (name + ".log")).string() + " 2>&1");
  }

  std::string logs() const {
    std::string all;
    for (const auto& e : fs::directory_iterator(d)) {
      if (e.path().extension() == ".log") {
        all += "---- " + e.path().filename().string() + "\n" + slurp_file(e.path());
      }
    }
    return all;
  }
};

// Waits for every process; all must exit 0.
void finish(std::vector<ChildProcess>& procs, const Federation& f) {
  std::vector<int> rcs;
  for (auto& p : procs) rcs.push_back(p.wait_or_kill(seconds(120)));
  INFO(f.logs());
  for (int rc : rcs) CHECK(rc == 0);
}

}  // namespace

TEST_CASE("cli: root, three leaves and twelve clients equal the flat federation", "[apps][tiers]") {
  constexpr int kRounds = 2;
  std::vector<float> flat;
  {
    Federation f("starling_tier_flat", 101);
    f.write_root(kRounds, kClients, kClients);
    std::vector<ChildProcess> procs;
    procs.push_back(f.start("root", "aggregator"));
    REQUIRE(starling::testing::wait_for_text(f.d / "root.log", "listening"));
    for (int k = 0; k < kClients; ++k) {
      f.write_client(k, f.root_port);
      procs.push_back(f.start("client-" + std::to_string(k), "client"));
    }
    finish(procs, f);
    flat = model_values(f.d / "root_state" / "global_model.safetensors");
  }
  Federation f("starling_tier_two", 111);
  f.write_root(kRounds, kLeaves, kLeaves);
  std::vector<ChildProcess> procs;
  procs.push_back(f.start("root", "aggregator"));
  REQUIRE(starling::testing::wait_for_text(f.d / "root.log", "listening"));
  for (int l = 0; l < kLeaves; ++l) {
    f.write_leaf(l);
    procs.push_back(f.start("leaf-" + std::to_string(l), "aggregator"));
    for (int k = l * kClientsPerLeaf; k < (l + 1) * kClientsPerLeaf; ++k) {
      f.write_client(k, f.leaf_ports[static_cast<size_t>(l)]);
      procs.push_back(f.start("client-" + std::to_string(k), "client"));
    }
  }
  finish(procs, f);
  const auto tiered = model_values(f.d / "root_state" / "global_model.safetensors");
  REQUIRE(tiered.size() == flat.size());
  REQUIRE(tiered.size() > 1000);
  double worst = 0;
  bool moved = false;
  for (size_t i = 0; i < flat.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(tiered[i]) - flat[i]) /
                                std::max(1.0, std::abs(static_cast<double>(flat[i]))));
  }
  const auto rows = metrics(f.d / "root_state" / "metrics.jsonl");
  REQUIRE(rows.size() == kRounds);
  for (const auto& r : rows) {
    CHECK(r["updates"] == kLeaves);  // the root folds one partial sum per leaf
    moved = moved || r["examples"].get<double>() > 0;
  }
  CHECK(moved);
  INFO("largest relative difference " << worst);
  CHECK(worst < 1e-6);
  const std::string leaf_log = slurp_file(f.d / "leaf-0.log");
  CHECK_THAT(leaf_log, Catch::Contains("the mean goes up"));
  CHECK_THAT(leaf_log, Catch::Contains("the tier above ended the federation after 2 round(s)"));
}

TEST_CASE("cli: a leaf killed mid-round costs only its clients' updates, and rejoins restarted",
          "[apps][tiers]") {
  constexpr int kRounds = 3;
  Federation f("starling_tier_kill", 121);
  f.write_root(kRounds, kLeaves, 2);
  std::vector<ChildProcess> procs;
  procs.push_back(f.start("root", "aggregator"));
  REQUIRE(starling::testing::wait_for_text(f.d / "root.log", "listening"));
  ChildProcess victim;
  for (int l = 0; l < kLeaves; ++l) {
    f.write_leaf(l);
    // Leaf 1 SIGKILLs itself when the first upload chunk of its round 2 arrives.
    if (l == 1) {
      victim = f.start("leaf-1", "aggregator", "STARLING_CRASH_POINT=collecting@2");
    } else {
      procs.push_back(f.start("leaf-" + std::to_string(l), "aggregator"));
    }
    for (int k = l * kClientsPerLeaf; k < (l + 1) * kClientsPerLeaf; ++k) {
      f.write_client(k, f.leaf_ports[static_cast<size_t>(l)]);
      procs.push_back(f.start("client-" + std::to_string(k), "client"));
    }
  }
  victim.wait_or_kill(seconds(120));
  {
    INFO(f.logs());
    REQUIRE(victim.term_signal() == SIGKILL);
  }
  CHECK_THAT(slurp_file(f.d / "leaf-1.log"), Catch::Contains("crash point collecting@2"));
  // Restarted on the same config: it rejoins the root, and its clients come back to it.
  fs::rename(f.d / "leaf-1.log", f.d / "leaf-1.killed.log");
  procs.push_back(f.start("leaf-1", "aggregator"));
  finish(procs, f);
  const auto rows = metrics(f.d / "root_state" / "metrics.jsonl");
  INFO(f.logs());
  REQUIRE(rows.size() == kRounds);
  const double all = rows[0]["examples"].get<double>();
  CHECK(rows[0]["updates"] == kLeaves);
  CHECK(rows[1]["updates"] == kLeaves - 1);  // leaf 1's clients' updates, and nothing else
  CHECK(rows[1]["examples"].get<double>() < all);
  CHECK(rows[1]["examples"].get<double>() > all / 2);
  CHECK(rows[2]["updates"] == kLeaves);  // rejoined
  CHECK(rows[2]["examples"].get<double>() == all);
  // It resumed its link's state (the residuals of its uploads) and led round 3.
  CHECK_THAT(slurp_file(f.d / "leaf-1.log"), Catch::Contains("resumed from"));
  CHECK_THAT(slurp_file(f.d / "leaf-1.log"), Catch::Contains("leaf: round 3 closed"));
}

TEST_CASE("cli: a leaf config with a client certificate is refused, naming the role it needs",
          "[apps][tiers]") {
  Federation f("starling_tier_badcert", 131);
  // leaf-0's config, with client-0's certificate.
  std::ofstream(f.config("bad")) << tls_toml(f.d / "client-0", "client-0")
                                 << server_toml(f.leaf_ports[0], f.d / "bad_state", "client-0")
                                 << rounds_toml(1, 1, 1) << kCommon
                                 << "[upstream]\nport = " << f.root_port << "\n";
  const auto r = run("aggregator --config " + f.config("bad").string());
  INFO(r.out);
  CHECK(r.rc != 0);
  CHECK_THAT(r.out, Catch::Contains("has role 'client'") &&
                        Catch::Contains("needs a certificate of role leaf"));
  // And a leaf cannot be simulated.
  f.write_leaf(0);
  const auto s = run("aggregator --simulate --config " + f.config("leaf-0").string());
  CHECK(s.rc != 0);
  CHECK_THAT(s.out, Catch::Contains("serves real clients"));
}
