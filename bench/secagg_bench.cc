// secagg_bench: the cost of one SecAgg+ round (core/secagg, driven as `starling simulate` drives
// it: sim/secagg_round.h, every message framed as on the wire) beside Flower's SecAgg+ (pip
// flwr, bench/secagg_flower.py: its real SecAggPlusWorkflow and secaggplus_mod, in one process)
// at the same points, in the same run: clients per round, vector length, the fraction of clients
// that drop after sharing their keys, and the same neighbourhood (Flower's num_shares = our
// degree + 1, its reconstruction threshold = ours). Per point: one surviving client's
// computation per round (all its stages, mean over survivors), the server's computation per
// round, and the bytes one client sends and receives; our unmasked sum is checked against the
// plaintext sum of the survivors' vectors, and Flower's script checks its own.
//   bench/secagg_bench --clients 100,300,1000 --dims 100000,1000000 --dropout 0.1
//       --python /work/venvs/flwr/bin/python
// (bash bench/secagg_bench.sh makes the venv and runs the sweep.) The server's cost should grow
// no faster than n log n: the last column divides it by n log2 n, relative to the first row of
// the same dimension.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/secagg/crypto.h"
#include "core/util/rng.h"
#include "sim/secagg_round.h"

namespace {

using namespace starling;

struct Point {
  uint32_t clients = 0;
  uint64_t dim = 0;
  double client_s = 0;
  double server_s = 0;
  double bytes_per_client = 0;
  uint32_t degree = 0, threshold = 0;
  bool ok = false;
};

std::vector<uint64_t> parse_list(const std::string& s) {
  std::vector<uint64_t> v;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) v.push_back(std::stoull(item));
  return v;
}

Point ours(uint32_t n, uint64_t dim, double dropout, uint32_t bits, double tolerance) {
  v1::FedSecAggConfig cfg;
  cfg.set_enabled(true);
  cfg.set_modulus_bits(bits);
  cfg.set_dropout_tolerance(static_cast<float>(tolerance));
  std::vector<std::string> names;
  for (uint32_t i = 0; i < n; ++i) names.push_back("client-" + std::to_string(i));
  std::vector<uint32_t> order(n);
  for (uint32_t i = 0; i < n; ++i) order[i] = i;
  Rng rng(n + dim);
  for (uint32_t i = n; i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
  const std::set<uint32_t> dropped(order.begin(),
                                   order.begin() + static_cast<long>(std::lround(dropout * n)));
  std::vector<uint32_t> x(dim), expect(dim, 0);
  const uint32_t mask = secagg::modulus_mask(bits);
  auto input = [&](uint32_t i) -> const std::vector<uint32_t>* {
    if (dropped.count(i)) return nullptr;
    Rng r(1000 + i);
    for (size_t k = 0; k < dim; ++k) {
      x[k] = static_cast<uint32_t>(r.next_u64()) & mask;
      expect[k] = (expect[k] + x[k]) & mask;
    }
    return &x;
  };
  Point p;
  p.clients = n;
  p.dim = dim;
  auto params = sim::plan_secagg(cfg, n, dim);
  auto res = params.ok() ? sim::run_secagg_round(cfg, 1, *params, names, input)
                         : Result<sim::SecAggRoundResult>(params.status());
  if (!res.ok()) {
    std::fprintf(stderr, "secagg_bench: %u clients, %lu: %s\n", n, static_cast<unsigned long>(dim),
                 res.status().to_string().c_str());
    return p;
  }
  double s = 0, b = 0;
  int k = 0;
  for (uint32_t i = 0; i < n; ++i) {
    if (dropped.count(i)) continue;
    s += res->seconds_of[i];
    b += static_cast<double>(res->bytes_of[i]);
    ++k;
  }
  p.client_s = s / k;
  p.bytes_per_client = b / k;
  p.server_s = res->server_seconds;
  p.degree = res->degree;
  p.threshold = res->threshold;
  p.ok = res->sum_raw == expect;
  return p;
}

struct Peer {
  bool ran = false;
  bool exceeded = false;
  double client_s = 0, server_s = 0, bytes_per_client = 0;
  bool ok = false;
};

Peer flower(const std::string& python, const std::string& script, const Point& p, double dropout,
            double budget_s) {
  Peer f;
  if (python.empty()) return f;
  const std::string cmd =
      python + " " + script + " --clients " + std::to_string(p.clients) + " --dim " +
      std::to_string(p.dim) + " --dropout " + std::to_string(dropout) + " --num-shares " +
      std::to_string(p.degree + 1) + " --reconstruction-threshold " + std::to_string(p.threshold) +
      " --budget-s " + std::to_string(budget_s) + " 2>/dev/null";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return f;
  std::string out;
  char buf[4096];
  while (size_t got = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, got);
  const int rc = pclose(pipe);
  if (rc != 0 || out.empty()) {
    std::fprintf(stderr, "secagg_bench: `%s` failed (%d)\n", cmd.c_str(), rc);
    return f;
  }
  auto j = nlohmann::json::parse(out.substr(0, out.find('\n')), nullptr, false);
  if (j.is_discarded()) return f;
  f.ran = true;
  f.exceeded = j.value("exceeded_budget", false);
  if (!f.exceeded) {
    f.client_s = j.value("client_s", 0.0);
    f.server_s = j.value("server_s", 0.0);
    f.bytes_per_client = j.value("bytes_per_client", 0.0);
    f.ok = j.value("ok", false);
  }
  return f;
}

std::string cell(const Peer& f, double v, const char* fmt) {
  if (!f.ran) return "-";
  if (f.exceeded) return "> budget";
  char b[64];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"secagg_bench: one SecAgg+ round, starling beside Flower"};
  std::string clients = "100,300,1000", dims = "100000,1000000";
  double dropout = 0.1, budget_s = 600;
  uint32_t bits = 32;
  std::string python, script = "bench/secagg_flower.py";
  app.add_option("--clients", clients, "clients per round, comma-separated");
  app.add_option("--dims", dims, "vector lengths, comma-separated");
  app.add_option("--dropout", dropout, "fraction that drops after sharing keys");
  app.add_option("--bits", bits, "our modulus bits (Flower's modulus is 2^32)");
  app.add_option("--python", python, "Python with flwr installed (empty: ours only)");
  app.add_option("--flower-script", script, "bench/secagg_flower.py");
  app.add_option("--budget-s", budget_s, "Flower: give up on a round past this many seconds");
  CLI11_PARSE(app, argc, argv);

  std::printf(
      "SecAgg+ round: starling (core/secagg) vs Flower (flwr SecAggPlusWorkflow), %.0f%% "
      "dropping after the share stage\n",
      dropout * 100);
  std::printf(
      "| clients | dim | degree / t | client s: starling | Flower | x | server s: "
      "starling | Flower | x | bytes/client: starling | Flower | server / n log n |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::map<uint64_t, double> first;  // per dim: server_s / (n log2 n) of the first row
  bool all_ok = true;
  for (uint64_t dim : parse_list(dims)) {
    for (uint64_t n : parse_list(clients)) {
      const Point p = ours(static_cast<uint32_t>(n), dim, dropout, bits, dropout);
      all_ok = all_ok && p.ok;
      const Peer f = flower(python, script, p, dropout, budget_s);
      const double nlogn = static_cast<double>(n) * std::log2(static_cast<double>(n));
      if (!first.count(dim)) first[dim] = p.server_s / nlogn;
      std::printf(
          "| %lu | %lu | %u / %u | %.4f%s | %s | %s | %.3f | %s | %s | %.0f | %s | %.2f |\n",
          static_cast<unsigned long>(n), static_cast<unsigned long>(dim), p.degree, p.threshold,
          p.client_s, p.ok ? "" : " (WRONG SUM)", cell(f, f.client_s, "%.4f").c_str(),
          cell(f, f.client_s / p.client_s, "%.1f").c_str(), p.server_s,
          cell(f, f.server_s, "%.3f").c_str(), cell(f, f.server_s / p.server_s, "%.1f").c_str(),
          p.bytes_per_client, cell(f, f.bytes_per_client, "%.0f").c_str(),
          p.server_s / nlogn / first[dim]);
      std::fflush(stdout);
      if (f.ran && !f.exceeded && !f.ok) std::printf("  (Flower's own sum check failed)\n");
    }
  }
  std::printf("starling sums %s\n", all_ok ? "exact at every point" : "WRONG at some point");
  return all_ok ? 0 : 1;
}
