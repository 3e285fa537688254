// An edge device's life from the command line: certificates from `starling certs`, a config,
// `starling client --check` before and after the aggregator is up, then a client killed with
// SIGKILL during local training and restarted: its state file is intact, it rejoins, and the
// federation completes.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

namespace fs = std::filesystem;

namespace {

const std::string kBinary = std::string(STARLING_BINARY_DIR) + "/apps/starling";

struct Run {
  int rc = -1;
  std::string out;
};

Run run(const std::string& args) {
  const std::string cmd = kBinary + " --log-level warn " + args + " 2>&1";
  Run r;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// A child process running `starling ARGS`, output to `log`.
pid_t spawn(const std::string& args, const fs::path& log) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const std::string cmd = "exec " + kBinary + " " + args + " >" + log.string() + " 2>&1";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// Waits up to `seconds` for the child; its exit code, or -1 if it is still running.
int wait_for(pid_t pid, int seconds) {
  for (int i = 0; i < seconds * 20; ++i) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -2;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return -1;
}

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
  const int port = 20000 + static_cast<int>(getpid() % 20000);
  const std::string common =
      "[rounds]\nnum_rounds = 3\nclients_per_round = 1\nmin_available = 1\n"
      "round_deadline_ms = 5000\n"
      "[local]\nepochs = 1\nlocal_steps = 1500\nbatch_size = 10\nlearning_rate = 0.05\n"
      "codec = \"topk:ratio=0.05,ef=1\"\n"
      "[data]\ndataset = \"mnist\"\nnum_clients = 20\npartition = \"IID\"\n"
      "[model]\nhidden = 32\n[eval]\nevery_rounds = 0\n";
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
  Run check = run(client_args + " --check --check-timeout 2");
  INFO(check.out);
  CHECK(check.rc == 1);
  CHECK_THAT(check.out, Catch::Contains("ok    certificate   CN=client-0"));
  CHECK_THAT(check.out, Catch::Contains("ok    data"));
  CHECK_THAT(check.out, Catch::Contains("ok    memory"));
  CHECK_THAT(check.out, Catch::Contains("FAIL  aggregator"));
  CHECK_THAT(check.out, Catch::Contains("1 check(s) failed"));

  const pid_t agg = spawn("aggregator --config " + (d / "agg.toml").string(), d / "agg.log");
  bool up = false;
  for (int i = 0; i < 100 && !up; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    up = slurp(d / "agg.log").find("listening") != std::string::npos;
  }
  REQUIRE(up);
  check = run(client_args + " --check");
  INFO(check.out);
  CHECK(check.rc == 0);
  CHECK_THAT(check.out, Catch::Contains("aggregator aggregator at 127.0.0.1"));

  // Kill the client as soon as its first update is acknowledged: it is then training round 2.
  pid_t client = spawn("--log-level info " + client_args, d / "client1.log");
  bool saved = false;
  for (int i = 0; i < 600 && !saved; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    saved = fs::exists(state);
  }
  REQUIRE(saved);
  kill(client, SIGKILL);
  CHECK(wait_for(client, 10) == -2);

  check = run(client_args + " --check");
  INFO(check.out);
  CHECK(check.rc == 0);
  CHECK_THAT(check.out, Catch::Contains("ok    state"));
  CHECK_THAT(check.out, Catch::Contains("1 rounds trained"));

  client = spawn("--log-level info " + client_args, d / "client2.log");
  const int client_rc = wait_for(client, 120);
  const int agg_rc = wait_for(agg, 30);
  if (client_rc == -1) kill(client, SIGKILL);
  if (agg_rc == -1) kill(agg, SIGKILL);
  INFO(slurp(d / "client2.log"));
  INFO(slurp(d / "agg.log"));
  CHECK(client_rc == 0);
  CHECK(agg_rc == 0);
  CHECK_THAT(slurp(d / "client2.log"), Catch::Contains("resumed from"));
  check = run(client_args + " --check --check-timeout 1");
  CHECK_THAT(check.out, Catch::Contains("3 rounds trained"));
  fs::remove_all(d);
}
