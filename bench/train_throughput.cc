// Training throughput of a GPT engine on one shape (--engine autograd: core/autograd + core/optim;
// fused: models/gpt/fused_gpt on its CPU backend): forward + backward + clip + AdamW per step,
// random tokens, median over timed steps. --model mdlm times the masked diffusion LM's step on the
// same trunk (models/mdlm: bidirectional attention, V + 1 embeddings, Mdlm::loss with Bernoulli
// masks), on either engine (fused: models/mdlm/fused_engine.h). Prints one JSON line (for the
// wrapper script). Run bench/train_throughput.sh for the table beside PyTorch.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd/autograd.h"
#include "core/ops/blas_core.h"
#include "core/optim/optimizer.h"
#include "core/util/memory.h"
#include "models/gpt/fused_backend.h"
#include "models/gpt/fused_gpt.h"
#include "models/gpt/gpt.h"
#include "models/mdlm/fused_engine.h"
#include "models/mdlm/mdlm.h"

int main(int argc, char** argv) {
  CLI::App app{"starling GPT training throughput"};
  starling::models::GptConfig c;
  int64_t batch = 12, warmup = 5, steps = 30;
  int threads = 0;
  std::string engine = "autograd", model_kind = "gpt";
  app.add_option("--vocab", c.vocab_size)->capture_default_str();
  app.add_option("--block", c.block_size)->capture_default_str();
  app.add_option("--layers", c.n_layer)->capture_default_str();
  app.add_option("--heads", c.n_head)->capture_default_str();
  app.add_option("--embd", c.n_embd)->capture_default_str();
  app.add_option("--batch", batch)->capture_default_str();
  app.add_option("--warmup", warmup)->capture_default_str();
  app.add_option("--steps", steps)->capture_default_str();
  app.add_option("--threads", threads, "0: all cores")->capture_default_str();
  app.add_option("--engine", engine, "autograd or fused")
      ->check(CLI::IsMember({"autograd", "fused"}))
      ->capture_default_str();
  app.add_option("--model", model_kind, "gpt or mdlm")
      ->check(CLI::IsMember({"gpt", "mdlm"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  starling::util::keep_freed_memory();  // as `starling train`
  if (threads > 0) omp_set_num_threads(threads);
  const bool mdlm = model_kind == "mdlm";

  starling::models::Gpt model(c, 1337);
  starling::models::MdlmConfig mc;
  mc.vocab_size = c.vocab_size;
  mc.block_size = c.block_size;
  mc.n_layer = c.n_layer;
  mc.n_head = c.n_head;
  mc.n_embd = c.n_embd;
  starling::models::Mdlm diffusion(mc, 1337);
  starling::nn::Module& trained = mdlm ? static_cast<starling::nn::Module&>(diffusion) : model;
  starling::optim::AdamW opt(starling::optim::decay_matrices_only(trained.parameters()),
                             {0.9, 0.99, 1e-8, 0.1});
  starling::Rng mask_rng(2);
  std::unique_ptr<starling::models::FusedGpt> fused;
  std::unique_ptr<starling::models::FusedMdlm> fused_mdlm;
  if (engine == "fused" && mdlm) {
    auto f = starling::models::FusedMdlm::make(mc, batch, 1337,
                                               starling::models::make_fused_cpu_backend());
    if (!f.ok()) {
      std::fprintf(stderr, "%s\n", f.status().to_string().c_str());
      return 1;
    }
    fused_mdlm = std::move(*f);
  } else if (engine == "fused") {
    auto f = starling::models::FusedGpt::make(c, batch, c.block_size, 1337,
                                              starling::models::make_fused_cpu_backend());
    if (!f.ok()) {
      std::fprintf(stderr, "%s\n", f.status().to_string().c_str());
      return 1;
    }
    fused = std::move(*f);
  }
  const starling::models::FusedOptimizer fused_opt{0.9, 0.99, 1e-8, 0.1};
  starling::Rng rng(1);
  std::vector<int32_t> x(static_cast<size_t>(batch * c.block_size)), y(x.size());
  std::vector<double> times;
  double loss_v = 0;
  for (int64_t s = 0; s < warmup + steps; ++s) {
    for (auto& v : x) v = static_cast<int32_t>(rng.below(static_cast<uint64_t>(c.vocab_size)));
    for (auto& v : y) v = static_cast<int32_t>(rng.below(static_cast<uint64_t>(c.vocab_size)));
    const auto tx = starling::Tensor::from_vector(x, {batch, c.block_size});
    const auto ty = starling::Tensor::from_vector(y, {batch, c.block_size});
    const auto t0 = std::chrono::steady_clock::now();
    if (fused_mdlm) {
      auto r = fused_mdlm->train_step(tx, mask_rng, 1e-3, fused_opt, 1.0);
      if (!r.ok()) {
        std::fprintf(stderr, "%s\n", r.status().to_string().c_str());
        return 1;
      }
      loss_v = r->loss;
    } else if (fused) {
      auto r = fused->train_step(x.data(), y.data(), x.size(), 1e-3, fused_opt, 1.0);
      if (!r.ok()) {
        std::fprintf(stderr, "%s\n", r.status().to_string().c_str());
        return 1;
      }
      loss_v = r->loss;
    } else {
      starling::Tensor loss = mdlm ? diffusion.loss(tx, mask_rng) : model.loss(tx, ty);
      starling::autograd::backward(loss);
      starling::optim::clip_grad_norm(trained.parameters(), 1.0);
      opt.step(1e-3);
      opt.zero_grad();
      loss_v = loss.item();
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s >= warmup) times.push_back(dt);
  }
  std::sort(times.begin(), times.end());
  const double med = times[times.size() / 2];
  const double tps = static_cast<double>(batch * c.block_size) / med;
  // Peak resident set (VmHWM, kB) of the process: the column beside PyTorch's.
  double peak_mb = 0;
  {
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("VmHWM:", 0) == 0) peak_mb = std::stod(line.substr(6)) / 1024.0;
    }
  }
  std::printf(
      "{\"engine\":\"starling %s\",\"model\":\"%s\",\"threads\":%d,\"ms_per_step\":%.3f,"
      "\"tokens_per_s\":%.1f,\"params\":%lld,\"peak_rss_mb\":%.1f,\"loss\":%.4f,"
      "\"blas\":\"%s\"}\n",
      engine.c_str(), model_kind.c_str(), omp_get_max_threads(), med * 1e3, tps,
      static_cast<long long>(trained.num_parameters()), peak_mb, loss_v,
      starling::ops::blas_core().c_str());
  return 0;
}
