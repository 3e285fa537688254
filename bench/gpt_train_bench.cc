// gpt_train_bench: training-step throughput of the fused GPT trainer on a CUDA device (fp32),
// beside PyTorch eager and torch.compile (bench/torch_gpt.py) on the same shapes in the same
// run: ms/step, tokens/s, MFU by llm.c's formula, peak device memory. Built only with CUDA.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/cuda/device.h"
#include "core/util/rng.h"
#include "models/gpt/fused_gpt.h"

namespace {

using starling::models::GptConfig;

struct Shape {
  std::string name;
  GptConfig config;
  int64_t batch = 0;
};

Shape char_shape() {  // the char GPT of the issue: V=65 T=256 L=6 H=6 C=384 B=64
  Shape s{"char", {}, 64};
  s.config.vocab_size = 65;
  s.config.block_size = 256;
  s.config.n_layer = 6;
  s.config.n_head = 6;
  s.config.n_embd = 384;
  s.config.bias = false;
  return s;
}

Shape gpt2_shape() {  // GPT-2 124M: V=50304 T=1024 L=12 H=12 C=768 B=16, with biases
  Shape s{"gpt2-124M", {}, 16};
  s.config.vocab_size = 50304;
  s.config.block_size = 1024;
  s.config.n_layer = 12;
  s.config.n_head = 12;
  s.config.n_embd = 768;
  s.config.bias = true;
  return s;
}

struct Row {
  std::string engine;
  double ms = 0, tokens_per_s = 0, mfu = -1, peak_gb = -1, loss = 0;
  std::string note;
  std::string profile;  // --profile: fused_profile_table
};

// Peak dense fp32 (non-tensor-core) TFLOP/s by device name, as llm.c's mfu.h tabulates peaks;
// -1 when unknown (then --peak-tflops gives it).
double fp32_peak_tflops(const std::string& device) {
  if (device.find("H100") != std::string::npos || device.find("H200") != std::string::npos)
    return 67.0;  // SXM
  if (device.find("A100") != std::string::npos) return 19.5;
  if (device.find("L40S") != std::string::npos) return 91.6;
  if (device.find("4090") != std::string::npos) return 82.6;
  return -1.0;
}

// Peak dense bf16 tensor-core TFLOP/s (llm.c's mfu.h figures, without sparsity); -1 when unknown.
double bf16_peak_tflops(const std::string& device) {
  if (device.find("H100") != std::string::npos || device.find("H200") != std::string::npos)
    return 989.5;  // SXM
  if (device.find("A100") != std::string::npos) return 312.0;
  if (device.find("L40S") != std::string::npos) return 362.05;
  if (device.find("4090") != std::string::npos) return 165.2;
  return -1.0;
}

// llm.c's gpt2_estimate_mfu: flops per token = 6 N + 6 L C T.
double mfu(const GptConfig& c, double params, int64_t tokens_per_step, double seconds,
           double peak_tflops) {
  if (peak_tflops <= 0) return -1.0;
  const double per_token = 6.0 * params + 6.0 * static_cast<double>(c.n_layer * c.n_embd) *
                                              static_cast<double>(c.block_size);
  return per_token * static_cast<double>(tokens_per_step) / seconds / (peak_tflops * 1e12);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

Row run_ours(const Shape& s, int gpu, int warmup, int steps, double peak, bool bf16,
             int profile_steps, double* params_out) {
  Row r;
  r.engine = bf16 ? "starling fused (bf16 linear)" : "starling fused (fp32)";
  auto backend = starling::models::make_fused_cuda_backend(gpu);
  if (!backend.ok()) {
    r.note = backend.status().message();
    return r;
  }
  auto model = starling::models::FusedGpt::make(s.config, s.batch, s.config.block_size, 1337,
                                                std::move(*backend));
  if (!model.ok()) {
    r.note = model.status().message();
    return r;
  }
  auto& m = **model;
  if (auto st = m.set_bf16_matmuls(bf16); !st.ok()) {
    r.note = st.message();
    return r;
  }
  *params_out = static_cast<double>(m.num_parameters());
  const size_t n = static_cast<size_t>(s.batch * s.config.block_size);
  starling::Rng rng(7);
  std::vector<std::vector<int32_t>> xs(2, std::vector<int32_t>(n)), ys = xs;
  for (int k = 0; k < 2; ++k) {
    for (size_t i = 0; i < n; ++i) {
      xs[k][i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(s.config.vocab_size)));
      ys[k][i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(s.config.vocab_size)));
    }
  }
  const starling::models::FusedOptimizer opt{0.9, 0.99, 1e-8, 0.1};
  std::vector<double> times;
  for (int it = 0; it < warmup + steps; ++it) {
    const auto t0 = std::chrono::steady_clock::now();
    auto st = m.train_step(xs[it % 2].data(), ys[it % 2].data(), n, 1e-4, opt, 1.0);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!st.ok()) {
      r.note = st.status().message();
      return r;
    }
    r.loss = st->loss;
    if (it >= warmup) times.push_back(dt);
  }
  const double sec = median(times);
  r.note = "CUDA graph " + m.graph_note();  // STARLING_CUDA_GRAPHS=0: eager steps
  if (profile_steps > 0) {
    // Where a step goes: each operation timed by CUDA events on the stream (the events add a
    // little to the step; the table's shares are of the step measured above).
    m.backend().set_profiling(true);
    for (int it = 0; it < profile_steps; ++it) {
      auto st = m.train_step(xs[it % 2].data(), ys[it % 2].data(), n, 1e-4, opt, 1.0);
      if (!st.ok()) break;
    }
    const auto entries = m.backend().take_profile();
    m.backend().set_profiling(false);
    r.profile = starling::models::fused_profile_table(entries, profile_steps, sec * 1e3);
  }
  r.ms = sec * 1e3;
  r.tokens_per_s = static_cast<double>(n) / sec;
  r.mfu = mfu(s.config, *params_out, static_cast<int64_t>(n), sec, peak);
  r.peak_gb = static_cast<double>(m.backend().peak_bytes()) / 1e9;
  return r;
}

Row run_torch(const Shape& s, const std::string& python, const std::string& script, bool compile,
              bool bf16, int warmup, int steps, double params, double peak) {
  Row r;
  r.engine = compile ? "pytorch torch.compile (fp32)" : "pytorch eager (fp32)";
  const auto& c = s.config;
  std::ostringstream cmd;
  cmd << python << " " << script << " --device cuda --vocab " << c.vocab_size << " --block "
      << c.block_size << " --layers " << c.n_layer << " --heads " << c.n_head << " --embd "
      << c.n_embd << " --batch " << s.batch << " --warmup " << warmup + (compile ? 2 : 0)
      << " --steps " << steps << (c.bias ? " --bias" : "") << (compile ? " --compile" : "")
      << (bf16 ? " --bf16" : "") << " 2>&1";
  FILE* p = popen(cmd.str().c_str(), "r");
  if (p == nullptr) {
    r.note = "cannot run " + python;
    return r;
  }
  std::string out, last_json;
  char buf[4096];
  while (fgets(buf, sizeof buf, p) != nullptr) {
    out += buf;
    if (buf[0] == '{') last_json = buf;
  }
  const int rc = pclose(p);
  if (rc != 0 || last_json.empty()) {
    const std::string tail = out.size() > 300 ? out.substr(out.size() - 300) : out;
    r.note = "torch_gpt.py failed (rc " + std::to_string(rc) + "): " + tail;
    std::replace(r.note.begin(), r.note.end(), '\n', ' ');
    std::replace(r.note.begin(), r.note.end(), '|', '/');  // keeps the markdown table intact
    return r;
  }
  try {
    const auto j = nlohmann::json::parse(last_json);
    r.ms = j.at("ms_per_step").get<double>();
    r.tokens_per_s = j.at("tokens_per_s").get<double>();
    r.loss = j.at("loss").get<double>();
    r.peak_gb = j.value("peak_mem_bytes", -1.0) / 1e9;
    r.engine = j.at("engine").get<std::string>() + " (fp32)";
    const double torch_params = j.at("params").get<double>();
    if (params > 0 && torch_params != params) {
      r.note =
          "torch counts " + std::to_string(static_cast<long long>(torch_params)) + " parameters";
    }
    r.mfu = mfu(c, torch_params, s.batch * c.block_size, r.ms * 1e-3, peak);
  } catch (const std::exception& e) {
    r.note = std::string("bad torch_gpt.py output: ") + e.what();
  }
  return r;
}

void print_row(const Shape& s, const Row& r) {
  const auto& c = s.config;
  std::printf("| %s V=%lld T=%lld L=%lld H=%lld C=%lld B=%lld | %s | ", s.name.c_str(),
              static_cast<long long>(c.vocab_size), static_cast<long long>(c.block_size),
              static_cast<long long>(c.n_layer), static_cast<long long>(c.n_head),
              static_cast<long long>(c.n_embd), static_cast<long long>(s.batch), r.engine.c_str());
  if (r.tokens_per_s > 0) {
    std::printf("%.2f | %.0f | ", r.ms, r.tokens_per_s);
    if (r.mfu >= 0)
      std::printf("%.1f%% | ", 100.0 * r.mfu);
    else
      std::printf("n/a | ");
    if (r.peak_gb >= 0)
      std::printf("%.2f | ", r.peak_gb);
    else
      std::printf("n/a | ");
    std::printf("%.4f | %s |\n", r.loss, r.note.c_str());
  } else {
    std::printf("- | - | - | - | - | %s |\n", r.note.c_str());
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("gpt_train_bench: fused GPT training steps on CUDA beside PyTorch");
  std::string shapes = "char,gpt2";
  int gpu = 0, warmup = 3, steps = 10;
  std::string python = "python3", script = "bench/torch_gpt.py";
  bool no_torch = false;
  int profile_steps = 0;
  double peak = 0.0;
  std::string precision = "bf16";
  app.add_option("--shapes", shapes, "Comma list of char, gpt2");
  app.add_option("--precision", precision,
                 "bf16 (linear layers in bf16, PyTorch under autocast) or fp32 (both fp32)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--gpu", gpu, "CUDA device");
  app.add_option("--warmup", warmup, "Untimed steps first");
  app.add_option("--steps", steps, "Timed steps (the median is reported)");
  app.add_option("--python", python, "Python with PyTorch");
  app.add_option("--torch-script", script, "Path of bench/torch_gpt.py");
  app.add_flag("--no-torch", no_torch, "Skip the PyTorch rows");
  app.add_option("--profile", profile_steps,
                 "After the timed steps, this many more with every operation timed (CUDA events); "
                 "prints where a step goes, per operation");
  app.add_option("--peak-tflops", peak,
                 "Device peak for MFU at --precision (default: by device name)");
  CLI11_PARSE(app, argc, argv);

  const auto devs = starling::cuda::devices();
  if (devs.empty() || gpu < 0 || gpu >= static_cast<int>(devs.size())) {
    std::fprintf(stderr, "gpt_train_bench: no CUDA device %d visible\n", gpu);
    return 1;
  }
  const std::string dev = devs[static_cast<size_t>(gpu)].name;
  if (peak <= 0) peak = precision == "bf16" ? bf16_peak_tflops(dev) : fp32_peak_tflops(dev);
  std::printf("GPU: %s; %s peak for MFU: %.1f TFLOP/s; %d warmup + %d timed steps\n\n", dev.c_str(),
              precision.c_str(), peak, warmup, steps);
  std::printf(
      "| shape | engine | ms/step | tokens/s | MFU | peak mem GB | last loss | note |\n"
      "|---|---|---|---|---|---|---|---|\n");
  std::vector<std::string> summary, profiles;
  std::stringstream ss(shapes);
  std::string name;
  while (std::getline(ss, name, ',')) {
    std::optional<Shape> s;
    if (name == "char") s = char_shape();
    if (name == "gpt2") s = gpt2_shape();
    if (!s) {
      std::fprintf(stderr, "gpt_train_bench: unknown shape '%s' (char, gpt2)\n", name.c_str());
      return 1;
    }
    double params = 0.0;
    const bool bf16 = precision == "bf16";
    // Frees its memory.
    const Row ours = run_ours(*s, gpu, warmup, steps, peak, bf16, profile_steps, &params);
    print_row(*s, ours);
    if (!ours.profile.empty()) {
      profiles.push_back("Where a step of " + s->name + " goes (" + ours.engine + ", " +
                         std::to_string(profile_steps) + " profiled steps):\n\n" + ours.profile);
    }
    if (no_torch) continue;
    for (const bool compile : {false, true}) {
      const Row t = run_torch(*s, python, script, compile, bf16, warmup, steps, params, peak);
      print_row(*s, t);
      if (ours.tokens_per_s > 0 && t.tokens_per_s > 0) {
        char line[256];
        std::snprintf(line, sizeof line, "ratio: %s: ours / %s = %.2fx tokens/s, memory %.2fx",
                      s->name.c_str(), t.engine.c_str(), ours.tokens_per_s / t.tokens_per_s,
                      t.peak_gb > 0 ? ours.peak_gb / t.peak_gb : 0.0);
        summary.emplace_back(line);
      }
    }
  }
  std::printf("\n");
  for (const auto& l : summary) std::printf("%s\n", l.c_str());
  for (const auto& p : profiles) std::printf("\n%s", p.c_str());
  return 0;
}
