// `mpirun -n R starling simulate`: a simulation shared by MPI ranks equals the one-process run
// within float tolerance, is byte-identical across runs with the same R, refuses what does not
// compose over ranks, and a rank killed mid-run stops the job with the last completed round's
// model on disk. A build without MPI refuses an MPI launch, saying how to get it.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "core/io/safetensors.h"
#include "tests/testing/child_process.h"

namespace fs = std::filesystem;
using Catch::Contains;
using starling::testing::run_shell;
using starling::testing::starling_binary;

namespace {

bool built_with_mpi() {
  return run_shell(starling_binary() + " info").out.find("mpi: built") != std::string::npos;
}

bool have_mpirun() { return run_shell("mpirun --version >/dev/null 2>&1").rc == 0; }

// mpirun as root needs --allow-run-as-root (CI runs as root); --oversubscribe lets 3 ranks share
// 2 cores. Leak checking stays off for the ranks: OpenMPI's own allocations are not ours.
std::string mpirun(int ranks) {
  return "env ASAN_OPTIONS=detect_leaks=0 mpirun --allow-run-as-root --oversubscribe -x "
         "ASAN_OPTIONS -n " +
         std::to_string(ranks) + " ";
}

fs::path write_config(const fs::path& dir, int rounds, const std::string& extra = "") {
  fs::create_directories(dir);
  const fs::path p = dir / "mpi.toml";
  std::ofstream(p) << "[simulate]\nmode = \"IN_PROCESS\"\nworkers = 1\nprogress = false\n"
                   << "[data]\ndataset = \"mnist\"\nnum_clients = 30\npartition = \"IID\"\n"
                   << "data_dir = \"" << STARLING_SOURCE_DIR << "/tests/fixtures/data\"\n"
                   << "[model]\narch = \"MLP\"\nhidden = 16\n"
                   << "[rounds]\nnum_rounds = " << rounds << "\nclients_per_round = 9\n"
                   << "[local]\nlocal_steps = 3\nbatch_size = 10\nlearning_rate = 0.1\n"
                   << "codec = \"topk:ratio=0.2,ef=1\"\n"
                   << "[eval]\nevery_rounds = 2\nmax_examples = 100\n"
                   << extra;
  return p;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// ||a - b|| / ||b|| over every tensor of two model files.
double relative_difference(const fs::path& a, const fs::path& b) {
  auto fa = starling::io::load_safetensors(a);
  auto fb = starling::io::load_safetensors(b);
  REQUIRE(fa.ok());
  REQUIRE(fb.ok());
  REQUIRE(fa->tensors.size() == fb->tensors.size());
  double diff = 0, norm = 0;
  for (size_t t = 0; t < fa->tensors.size(); ++t) {
    const auto& x = fa->tensors[t].second;
    const auto& y = fb->tensors[t].second;
    REQUIRE(x.numel() == y.numel());
    const float* px = x.data<float>();
    const float* py = y.data<float>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      diff += (double(px[i]) - py[i]) * (double(px[i]) - py[i]);
      norm += double(py[i]) * py[i];
    }
  }
  return std::sqrt(diff / norm);
}

}  // namespace

TEST_CASE("cli: mpirun shares a simulation's clients over ranks, reproducibly", "[apps][mpi]") {
  if (!built_with_mpi() || !have_mpirun()) {
    WARN("skipped: this starling has no MPI, or mpirun is not installed (scripts/deps.sh)");
    return;
  }
  const fs::path d = fs::temp_directory_path() / "mpi_sim";
  const fs::path cfg = write_config(d, 4);
  const std::string sim = starling_binary() + " --log-level warn simulate -q -c " + cfg.string();
  const auto one = run_shell(sim + " -o " + (d / "r1").string() + " 2>&1");
  INFO(one.out);
  REQUIRE(one.rc == 0);
  const auto a = run_shell(mpirun(3) + sim + " -o " + (d / "r3a").string() + " 2>&1");
  INFO(a.out);
  REQUIRE(a.rc == 0);
  CHECK_THAT(a.out, Contains("3 ranks; peak RSS per rank 0:"));
  const auto b = run_shell(mpirun(3) + sim + " -o " + (d / "r3b").string() + " 2>&1");
  REQUIRE(b.rc == 0);
  // The same R: the same bytes. One rank against three: the same model up to float sums.
  CHECK(slurp(d / "r3a" / "model.safetensors") == slurp(d / "r3b" / "model.safetensors"));
  CHECK(slurp(d / "r3a" / "metrics.jsonl") == slurp(d / "r3b" / "metrics.jsonl"));
  CHECK(relative_difference(d / "r3a" / "model.safetensors", d / "r1" / "model.safetensors") <
        1e-5);
  // Only rank 0 writes the run folder: one metrics line per round.
  const std::string metrics = slurp(d / "r3a" / "metrics.jsonl");
  CHECK(std::count(metrics.begin(), metrics.end(), '\n') == 4);

  // What does not compose over ranks is refused, naming the key, and the job ends.
  const fs::path median = write_config(d / "median", 2, "[robust]\nrule = \"MEDIAN\"\n");
  const auto m = run_shell(mpirun(2) + starling_binary() + " simulate -q -c " + median.string() +
                               " -o " + (d / "rm").string() + " 2>&1",
                           std::chrono::minutes(2));
  CHECK(m.rc != 0);
  CHECK_THAT(m.out, Contains("robust.rule") && Contains("partial sums"));
}

TEST_CASE("cli: a rank killed mid-run stops the job, the last round's model is on disk",
          "[apps][mpi]") {
  if (!built_with_mpi() || !have_mpirun()) {
    WARN("skipped: this starling has no MPI, or mpirun is not installed (scripts/deps.sh)");
    return;
  }
  const fs::path d = fs::temp_directory_path() / "mpi_kill";
  const fs::path cfg = write_config(d, 100000);
  const fs::path log = d / "log.txt";
  auto job = starling::testing::ChildProcess::shell(
      mpirun(3) + starling_binary() + " simulate -q -c " + cfg.string() + " -o " +
      (d / "run").string() + " >" + log.string() + " 2>&1");
  // Wait for a few completed rounds (rank 0 saves the model after each).
  const fs::path model = d / "run" / "model.safetensors";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(3);
  while (std::chrono::steady_clock::now() < deadline) {
    if (fs::exists(model) && slurp(d / "run" / "metrics.jsonl").size() > 200) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE(fs::exists(model));
  // SIGKILL the rank with the highest pid (not rank 0's writer, most likely; any rank will do).
  const auto ranks = run_shell("pgrep -P " + std::to_string(job.pid()) + " -f apps/starling");
  INFO(ranks.out);
  REQUIRE(ranks.rc == 0);
  const std::string last = ranks.out.substr(ranks.out.rfind('\n', ranks.out.size() - 2) + 1);
  REQUIRE(run_shell("kill -9 " + last).rc == 0);
  const int rc = job.wait_or_kill(std::chrono::minutes(1));
  CHECK(rc != 0);
  CHECK(rc != -2);  // the job ended by itself
  const std::string out = slurp(log);
  INFO(out);
  CHECK_THAT(out, Contains("rank") && (Contains("signal 9") || Contains("Killed")));
  // The model on disk is whole: the last completed round's.
  auto saved = starling::io::load_safetensors(model);
  REQUIRE(saved.ok());
  CHECK(std::stoi(saved->metadata.at("round")) >= 1);
}

TEST_CASE("cli: an MPI launch of a starling without MPI is refused, saying how to get it",
          "[apps][mpi]") {
  if (built_with_mpi()) {
    WARN("skipped: this starling has MPI (the other [mpi] tests run it)");
    return;
  }
  const auto r = run_shell("OMPI_COMM_WORLD_SIZE=4 " + starling_binary() +
                           " simulate -q -c /nonexistent.toml 2>&1");
  CHECK(r.rc != 0);
  CHECK_THAT(r.out, Contains("built without MPI") && Contains("libopenmpi-dev"));
}
