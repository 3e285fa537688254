// Data-parallel step time on CPU threads: 1 rank (plain backward, and through DataParallel) vs
// N ranks with the all-reduce after backward (overlap off) or during it (overlap on), on the
// char GPT shape of configs/gpt_char_cpu.toml with random tokens. Prints a table.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/autograd/autograd.h"
#include "core/comm/data_parallel.h"
#include "core/comm/run_ranks.h"
#include "core/optim/optimizer.h"
#include "models/gpt/gpt.h"

namespace {

using namespace starling;
using Clock = std::chrono::steady_clock;

struct Row {
  std::string name;
  int ranks = 1;
  bool ddp = false;
  bool overlap = false;
  double bucket_mb = 25;
};

struct Timing {
  double step_ms = 0;  // median forward + backward + all-reduce + clip + AdamW
  double wait_ms = 0;  // median time finish() waited for all-reduces (exposed communication)
  size_t buckets = 0;
  double loss = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

Result<Timing> run(const Row& row, const models::GptConfig& c, int64_t global_batch,
                   int total_threads, int warmup, int steps) {
  const int64_t b = global_batch / row.ranks;
  Timing out;
  std::vector<double> step_ms, wait_ms;
  const auto st = comm::run_ranks(row.ranks, std::chrono::seconds(60), [&](comm::Communicator& cm) {
    const int r = cm.rank();
    omp_set_num_threads(std::max(1, total_threads / row.ranks));
    models::Gpt model(c, 1337 + static_cast<uint64_t>(r));
    std::unique_ptr<comm::DataParallel> dp;
    if (row.ddp) {
      comm::DataParallelOptions o;
      o.overlap = row.overlap;
      o.bucket_bytes = static_cast<size_t>(row.bucket_mb * 1024 * 1024);
      ASSIGN_OR_RETURN(dp, comm::DataParallel::make(model.named_parameters(), cm, o));
      if (r == 0) out.buckets = dp->bucket_params().size();
    }
    optim::AdamW opt(optim::decay_matrices_only(model.parameters()), {0.9, 0.99, 1e-8, 0.1});
    Rng rng = Rng(1).fork(static_cast<uint64_t>(r));
    std::vector<int32_t> x(static_cast<size_t>(b * c.block_size)), y(x.size());
    for (int s = 0; s < warmup + steps; ++s) {
      for (auto& v : x) v = static_cast<int32_t>(rng.below(static_cast<uint64_t>(c.vocab_size)));
      for (auto& v : y) v = static_cast<int32_t>(rng.below(static_cast<uint64_t>(c.vocab_size)));
      const auto tx = Tensor::from_vector(x, {b, c.block_size});
      const auto ty = Tensor::from_vector(y, {b, c.block_size});
      const auto t0 = Clock::now();
      Tensor loss = model.loss(tx, ty);
      double wait = 0;
      if (dp) {
        autograd::backward(loss, Tensor(), [&dp](const Tensor& leaf) { dp->grad_ready(leaf); });
        const auto w0 = Clock::now();
        RETURN_IF_ERROR(dp->finish());
        wait = std::chrono::duration<double, std::milli>(Clock::now() - w0).count();
      } else {
        autograd::backward(loss);
      }
      optim::clip_grad_norm(model.parameters(), 1.0);
      opt.step(1e-3);
      opt.zero_grad();
      const double dt = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (r == 0 && s >= warmup) {
        step_ms.push_back(dt);
        wait_ms.push_back(wait);
        out.loss = loss.item();
      }
    }
    return ok_status();
  });
  RETURN_IF_ERROR(comm::first_error(st), row.name);
  out.step_ms = median(step_ms);
  out.wait_ms = median(wait_ms);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"starling data-parallel step time (CPU threads)"};
  models::GptConfig c;  // configs/gpt_char_cpu.toml: L=4, H=4, C=128, T=64, V=65
  int64_t batch = 12;
  int warmup = 3, steps = 20, threads = 2, ranks = 2;
  double bucket_mb = 0.5;
  app.add_option("--layers", c.n_layer)->capture_default_str();
  app.add_option("--heads", c.n_head)->capture_default_str();
  app.add_option("--embd", c.n_embd)->capture_default_str();
  app.add_option("--block", c.block_size)->capture_default_str();
  app.add_option("--batch", batch, "Global batch (split over the ranks)")->capture_default_str();
  app.add_option("--ranks", ranks, "Ranks of the data-parallel rows")->capture_default_str();
  app.add_option("--bucket-mb", bucket_mb, "Bucket cap of the overlapped rows")
      ->capture_default_str();
  app.add_option("--threads", threads, "OpenMP threads in total, split over the ranks")
      ->capture_default_str();
  app.add_option("--warmup", warmup)->capture_default_str();
  app.add_option("--steps", steps)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (ranks < 2 || batch % ranks != 0) {
    std::fprintf(stderr, "ddp_bench: --ranks must be >= 2 and divide --batch\n");
    return 1;
  }
  const std::string n = std::to_string(ranks);
  const std::vector<Row> rows = {
      {"1 rank, plain backward", 1, false, false, 25},
      {"1 rank, DataParallel", 1, true, true, bucket_mb},
      {n + " ranks, overlap off, one 25 MB bucket", ranks, true, false, 25},
      {n + " ranks, overlap off, small buckets", ranks, true, false, bucket_mb},
      {n + " ranks, overlap on, small buckets", ranks, true, true, bucket_mb},
  };
  {
    models::Gpt probe(c, 1);
    std::printf(
        "GPT L=%lld H=%lld C=%lld T=%lld V=%lld (%.2fM parameters), global batch %lld, %d "
        "OpenMP threads in total (at least 1 per rank), small buckets = %.2f MB, median of %d "
        "steps\n\n",
        static_cast<long long>(c.n_layer), static_cast<long long>(c.n_head),
        static_cast<long long>(c.n_embd), static_cast<long long>(c.block_size),
        static_cast<long long>(c.vocab_size), static_cast<double>(probe.num_parameters()) / 1e6,
        static_cast<long long>(batch), threads, bucket_mb, steps);
  }
  std::printf(
      "| run | rows/rank | threads/rank | buckets | ms/step | finish() wait ms | tokens/s |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const auto& row : rows) {
    auto t = run(row, c, batch, threads, warmup, steps);
    if (!t.ok()) {
      std::fprintf(stderr, "ddp_bench: %s\n", t.status().message().c_str());
      return 1;
    }
    std::printf("| %s | %lld | %d | %s | %.1f | %s | %.0f |\n", row.name.c_str(),
                static_cast<long long>(batch / row.ranks), std::max(1, threads / row.ranks),
                row.ddp ? std::to_string(t->buckets).c_str() : "-", t->step_ms,
                row.ddp ? std::to_string(t->wait_ms).substr(0, 5).c_str() : "-",
                static_cast<double>(batch * c.block_size) / (t->step_ms / 1000.0));
  }
  return 0;
}
