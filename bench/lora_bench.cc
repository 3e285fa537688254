// lora_bench: peak resident memory and step time of a LoRA training client on the GPT-2 124M
// shape (vocab 50257, 1024 positions, 12 layers, 12 heads, n_embd 768, biases, tanh GELU, tied
// head; random weights, which cost what the real ones do), starling's autograd engine beside
// PyTorch + peft (bench/hf/peft_lora_step.py, run through --python) doing the same steps in the
// same run: adapters of rank --rank on attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj of
// every block, the base frozen, AdamW (lr 1e-4) over the adapters, --steps steps of --batch x
// --seq random token ids, each forward + backward + clip_grad_norm(1.0) + step + zero_grad.
//
// Peak RSS (VmHWM) belongs to a process, so each side runs in a process of its own: starling in
// this program re-executed with the hidden flag --worker starling, PyTorch in the Python script.
// Both report their resident set after each phase too (model built, adapters + optimizer, the
// first step's forward, backward and update), printed below the table.
//
//   build/dev/bench/lora_bench              (from the repository root; see bench/hf/setup_venv.sh)
#include <omp.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/autograd/autograd.h"
#include "core/optim/optimizer.h"
#include "core/util/rng.h"
#include "edge_client/device.h"
#include "models/gpt/gpt.h"
#include "models/gpt/lora.h"

extern char** environ;

namespace {

using namespace starling;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

struct Options {
  int64_t batch = 4;
  int64_t seq = 128;
  int64_t steps = 5;
  int64_t rank = 8;
  double alpha = 16.0;
  double lr = 1e-4;
  int threads = 0;
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "lora_bench: %s\n", what.c_str());
  std::exit(1);
}

double mib(uint64_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

// [phase, VmRSS MiB, VmHWM MiB] of this process now.
json rss_phase(const std::string& name) {
  const auto now = edge_client::current_rss_bytes();
  const auto peak = edge_client::peak_rss_bytes();
  return json::array({name, now.ok() ? mib(*now) : -1.0, peak.ok() ? mib(*peak) : -1.0});
}

// ---------------------------------------------------------------------------------------------
// The starling side (run in a process of its own: --worker starling). One JSON line on stdout.

models::GptConfig gpt2_124m() {
  models::GptConfig c;
  c.vocab_size = 50257;
  c.block_size = 1024;
  c.n_layer = 12;
  c.n_head = 12;
  c.n_embd = 768;
  c.dropout = 0.0;
  c.bias = true;
  c.causal = true;
  c.gelu_tanh = true;
  return c;
}

int starling_worker(const Options& o) {
  if (o.threads > 0) omp_set_num_threads(o.threads);
  json phases = json::array();
  phases.push_back(rss_phase("startup"));

  const models::GptConfig config = gpt2_124m();
  if (const Status s = config.validate(); !s.ok()) die("config: " + s.to_string());
  if (o.seq > config.block_size) die("--seq is over the block size 1024");
  models::Gpt model(config, 1);
  phases.push_back(rss_phase("model built"));

  models::LoraSpec spec;
  spec.rank = o.rank;
  spec.alpha = o.alpha;
  spec.dropout = 0.0;
  spec.targets = models::lora_target_names();
  models::apply_lora(model, spec);
  model.train(true);
  const std::vector<Tensor> params = model.trainable_parameters();
  optim::AdamW adamw(optim::decay_matrices_only(params),
                     optim::AdamWOptions{0.9, 0.999, 1e-8, 0.01});  // torch.optim.AdamW's defaults
  phases.push_back(rss_phase("LoRA applied + optimizer"));

  Rng rng(1);
  std::vector<double> times;
  double loss_v = 0.0;
  const auto n = static_cast<size_t>(o.batch * o.seq);
  std::vector<int32_t> idx(n), targets(n);
  for (int64_t step = 0; step < o.steps; ++step) {
    // Next-token targets of a random sequence of seq + 1 tokens per row.
    for (int64_t b = 0; b < o.batch; ++b) {
      int32_t prev = static_cast<int32_t>(rng.below(static_cast<uint64_t>(config.vocab_size)));
      for (int64_t t = 0; t < o.seq; ++t) {
        const auto i = static_cast<size_t>(b * o.seq + t);
        const auto next = static_cast<int32_t>(rng.below(static_cast<uint64_t>(config.vocab_size)));
        idx[i] = prev;
        targets[i] = next;
        prev = next;
      }
    }
    const Tensor x = Tensor::from_vector(idx, {o.batch, o.seq});
    const Tensor y = Tensor::from_vector(targets, {o.batch, o.seq});
    const auto t0 = Clock::now();
    Tensor loss = model.loss(x, y);
    loss_v = loss.item();
    if (step == 0) phases.push_back(rss_phase("step 1 forward"));
    autograd::backward(loss);
    if (step == 0) phases.push_back(rss_phase("step 1 backward"));
    optim::clip_grad_norm(params, 1.0);
    adamw.step(o.lr);
    model.zero_grad();
    if (step == 0) phases.push_back(rss_phase("step 1 optimizer"));
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (!std::isfinite(loss_v)) {
      die("loss " + std::to_string(loss_v) + " at step " + std::to_string(step));
    }
  }
  phases.push_back(rss_phase("after all steps"));

  double sum = 0.0;
  const size_t first = times.size() > 1 ? 1 : 0;
  for (size_t i = first; i < times.size(); ++i) sum += times[i];
  const auto peak = edge_client::peak_rss_bytes();
  if (!peak.ok()) die("peak RSS: " + peak.status().to_string());
  const json out = {{"peak_rss_mib", mib(*peak)},
                    {"step_s", sum / static_cast<double>(times.size() - first)},
                    {"trainable", model.num_trainable_parameters()},
                    {"total", model.num_parameters()},
                    {"threads", omp_get_max_threads()},
                    {"loss", loss_v},
                    {"phases", phases}};
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  return 0;
}

// ---------------------------------------------------------------------------------------------
// The driver.

// Runs argv[0] with its arguments (no shell); returns the last line of its stdout that parses as
// a JSON object, or null when it failed. Its stderr passes through.
json run_json(const std::vector<std::string>& argv) {
  std::string shown;
  for (const auto& a : argv) shown += (shown.empty() ? "" : " ") + a;
  std::fprintf(stderr, "lora_bench: running %s\n", shown.c_str());
  int fd[2];
  if (::pipe(fd) != 0) die("pipe");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fd[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, fd[0]);
  posix_spawn_file_actions_addclose(&actions, fd[1]);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fd[1]);
  if (rc != 0) {
    ::close(fd[0]);
    std::fprintf(stderr, "lora_bench: cannot run %s: %s\n", args[0], std::strerror(rc));
    return nullptr;
  }
  std::string out;
  char buf[4096];
  for (ssize_t got; (got = ::read(fd[0], buf, sizeof(buf))) != 0;) {
    if (got < 0) {
      if (errno == EINTR) continue;
      break;
    }
    out.append(buf, static_cast<size_t>(got));
  }
  ::close(fd[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "lora_bench: %s failed (status %d)\n", shown.c_str(), status);
    return nullptr;
  }
  json last = nullptr;
  size_t begin = 0;
  while (begin < out.size()) {
    size_t end = out.find('\n', begin);
    if (end == std::string::npos) end = out.size();
    if (out[begin] == '{') {
      json j = json::parse(out.substr(begin, end - begin), nullptr, false);
      if (j.is_object()) last = std::move(j);
    }
    begin = end + 1;
  }
  if (last.is_null()) std::fprintf(stderr, "lora_bench: no JSON line from %s\n", shown.c_str());
  return last;
}

std::vector<std::string> common_args(const Options& o) {
  return {"--batch", std::to_string(o.batch), "--seq",     std::to_string(o.seq),
          "--steps", std::to_string(o.steps), "--rank",    std::to_string(o.rank),
          "--alpha", std::to_string(o.alpha), "--threads", std::to_string(o.threads)};
}

std::string with_commas(int64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

void print_row(const std::string& engine, const json& r) {
  std::printf("| %s | %.0f | %.3f | %s | %s |\n", engine.c_str(), r.value("peak_rss_mib", 0.0),
              r.value("step_s", 0.0), with_commas(r.value("trainable", int64_t{0})).c_str(),
              with_commas(r.value("total", int64_t{0})).c_str());
}

// "RSS / peak" of the phase called `name` in a side's report, or "-".
std::string phase_cell(const json& r, const std::string& name) {
  if (!r.is_object() || !r.contains("phases")) return "-";
  for (const auto& p : r["phases"]) {
    if (p.is_array() && p.size() == 3 && p[0] == name) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.0f / %.0f", p[1].get<double>(), p[2].get<double>());
      return buf;
    }
  }
  return "-";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Peak RSS and step time of GPT-2 124M LoRA training: starling vs PyTorch + peft"};
  Options o;
  std::string python = "bench/hf/.venv/bin/python";
  std::string script = "bench/hf/peft_lora_step.py";
  std::string worker;
  bool skip_torch = false;
  app.add_option("--batch", o.batch, "Sequences per step")->capture_default_str();
  app.add_option("--seq", o.seq, "Tokens per sequence (<= 1024)")->capture_default_str();
  app.add_option("--steps", o.steps, "Training steps (s/step: the mean after the first)")
      ->capture_default_str();
  app.add_option("--rank", o.rank, "LoRA rank")->capture_default_str();
  app.add_option("--alpha", o.alpha, "LoRA alpha")->capture_default_str();
  app.add_option("--threads", o.threads, "Threads of both engines (0: all cores)")
      ->capture_default_str();
  app.add_option("--python", python, "Python with torch, transformers and peft")
      ->capture_default_str();
  app.add_option("--script", script, "The PyTorch + peft side")->capture_default_str();
  app.add_flag("--skip-torch", skip_torch, "Measure starling only");
  app.add_option("--worker", worker, "Internal: run one side in this process")
      ->check(CLI::IsMember({"starling"}))
      ->group("");
  CLI11_PARSE(app, argc, argv);
  if (o.batch < 1 || o.seq < 2 || o.steps < 1 || o.rank < 1 || !(o.alpha > 0)) {
    die("--batch, --steps, --rank must be >= 1, --seq >= 2, --alpha > 0");
  }
  if (worker == "starling") return starling_worker(o);

  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) die("cannot find this program's path (/proc/self/exe): " + ec.message());

  // Starling first, then PyTorch: one after the other, so they do not share the cores.
  std::vector<std::string> cmd = {self, "--worker", "starling"};
  for (auto& a : common_args(o)) cmd.push_back(std::move(a));
  const json ours = run_json(cmd);
  if (!ours.is_object()) die("the starling worker failed");

  json torch = nullptr;
  std::string torch_note;
  if (skip_torch) {
    torch_note = "skipped (--skip-torch)";
  } else if (::access(python.c_str(), X_OK) != 0) {
    torch_note = "skipped: no Python at " + python + " (run bash bench/hf/setup_venv.sh)";
  } else if (::access(script.c_str(), R_OK) != 0) {
    torch_note = "skipped: no " + script + " (run from the repository root or pass --script)";
  } else {
    cmd = {python, script};
    for (auto& a : common_args(o)) cmd.push_back(std::move(a));
    torch = run_json(cmd);
    if (!torch.is_object()) torch_note = "failed (see its error above)";
  }

  std::printf(
      "\nLoRA training client, GPT-2 124M shape (random weights, fp32, CPU): batch %lld x seq "
      "%lld, %lld steps, rank %lld, alpha %g, adapters on attn.c_attn, attn.c_proj, mlp.c_fc, "
      "mlp.c_proj; AdamW lr %g, clip 1.0; threads: starling %d, PyTorch %s\n\n",
      static_cast<long long>(o.batch), static_cast<long long>(o.seq),
      static_cast<long long>(o.steps), static_cast<long long>(o.rank), o.alpha, o.lr,
      ours.value("threads", 0),
      torch.is_object() ? std::to_string(torch.value("threads", 0)).c_str() : "-");
  std::printf("| engine | peak RSS MiB | s/step | trainable params | total params |\n");
  std::printf("|---|---:|---:|---:|---:|\n");
  print_row("starling (autograd CPU, fp32)", ours);
  if (torch.is_object()) {
    print_row("PyTorch " + torch.value("torch", std::string("?")) + " + peft " +
                  torch.value("peft", std::string("?")) + " (CPU, fp32)",
              torch);
  } else {
    std::printf("| PyTorch + peft | %s | | | |\n", torch_note.c_str());
  }
  if (torch.is_object() && torch.value("peak_rss_mib", 0.0) > 0) {
    const double ratio = ours.value("peak_rss_mib", 0.0) / torch.value("peak_rss_mib", 0.0);
    std::printf("\nstarling / PyTorch peak RSS = %.2f (goal <= 0.33)\n", ratio);
    std::printf("starling / PyTorch s/step = %.2f\n",
                ours.value("step_s", 0.0) / torch.value("step_s", 1.0));
    std::printf(
        "final loss: starling %.4f, PyTorch %.4f (random weights: about ln 50257 = 10.82)\n",
        ours.value("loss", 0.0), torch.value("loss", 0.0));
  }

  // Where the memory goes: resident set now / peak so far, after each phase.
  std::printf("\nResident set after each phase, MiB (VmRSS now / VmHWM so far):\n\n");
  std::printf("| phase | starling | PyTorch + peft |\n|---|---:|---:|\n");
  std::vector<std::string> names;
  for (const json* side : std::initializer_list<const json*>{&ours, &torch}) {
    if (!side->is_object() || !side->contains("phases")) continue;
    for (const auto& p : (*side)["phases"]) {
      const std::string name = p[0].get<std::string>();
      bool seen = false;
      for (const auto& n : names) seen = seen || n == name;
      if (!seen) names.push_back(name);
    }
  }
  for (const auto& n : names) {
    std::printf("| %s | %s | %s |\n", n.c_str(), phase_cell(ours, n).c_str(),
                phase_cell(torch, n).c_str());
  }
  return 0;
}
