// Sampling speed with and without the KV cache, random weights: GPT generate (Gpt::generate with
// kv_cache on and off) at the char shape and the GPT-2 small shape, and the block-diffusion MDLM
// sampler (Mdlm::sample) at T = 256 with blocks of 4 and 16. Prints a table, or JSON lines with
// --json (for bench/sample_bench.sh). Both runs of a row use the same rng; the table says whether
// they drew the same tokens.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "core/util/rng.h"
#include "models/gpt/gpt.h"
#include "models/mdlm/mdlm.h"

namespace models = starling::models;
using starling::Rng;

namespace {

struct Row {
  std::string what;      // model and shape
  std::string mode;      // "kv cache" or "no cache"
  int64_t tokens = 0;    // tokens produced
  double seconds = 0.0;  // wall time of the whole call
  int64_t calls = 0;     // network calls (MDLM), 0 for the GPT
  bool same = true;      // ids equal to the other mode's
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

models::GptConfig gpt_shape(int64_t v, int64_t t, int64_t l, int64_t h, int64_t c) {
  models::GptConfig g;
  g.vocab_size = v;
  g.block_size = t;
  g.n_layer = l;
  g.n_head = h;
  g.n_embd = c;
  return g;
}

// GPT generate from a 1-token prompt, cached and uncached, same rng seed.
void bench_gpt(const std::string& name, const models::GptConfig& c, int64_t max_new,
               std::vector<Row>& out) {
  models::Gpt m(c, 1337);
  std::vector<int32_t> ids[2];
  for (int kv = 1; kv >= 0; --kv) {
    Rng rng(7);
    const double t0 = now_s();
    ids[kv] = m.generate({0}, max_new, 1.0, 0, rng, kv == 1);
    Row r{name, kv ? "kv cache" : "no cache", max_new, now_s() - t0, 0, true};
    out.push_back(r);
  }
  out[out.size() - 1].same = out[out.size() - 2].same = ids[0] == ids[1];
}

// The block-diffusion sampler: `num` sequences of T, `steps` steps per block.
void bench_bd3(const std::string& name, const models::MdlmConfig& c, int64_t num, int64_t steps,
               std::vector<Row>& out) {
  models::Mdlm m(c, 1337);
  std::vector<int32_t> ids[2];
  for (int kv = 1; kv >= 0; --kv) {
    Rng rng(7);
    models::SampleStats st;
    const double t0 = now_s();
    ids[kv] = m.sample(num, steps, 1.0, true, rng, &st, kv == 1);
    Row r{name, kv ? "kv cache" : "no cache", num * c.block_size, now_s() - t0, st.network_calls,
          true};
    out.push_back(r);
  }
  out[out.size() - 1].same = out[out.size() - 2].same = ids[0] == ids[1];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"starling sampling speed, KV cache on and off"};
  int threads = 1;
  int64_t char_new = 255, gpt2_new = 64, bd3_steps = 4, bd3_num = 1;
  bool json = false;
  std::vector<std::string> only;
  app.add_option("--threads", threads, "OpenMP threads (0: all cores)")->capture_default_str();
  app.add_option("--char-new", char_new, "char shape: new tokens")->capture_default_str();
  app.add_option("--gpt2-new", gpt2_new, "GPT-2 small shape: new tokens (0: skip)")
      ->capture_default_str();
  app.add_option("--bd3-steps", bd3_steps, "block diffusion: steps per block")
      ->capture_default_str();
  app.add_option("--bd3-num", bd3_num, "block diffusion: sequences sampled together")
      ->capture_default_str();
  app.add_option("--only", only, "rows to run: char, gpt2, bd3 (default: all)");
  app.add_flag("--json", json, "one JSON line per row");
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) omp_set_num_threads(threads);
  auto want = [&](const std::string& k) {
    if (only.empty()) return true;
    for (const auto& o : only) {
      if (o == k) return true;
    }
    return false;
  };

  std::vector<Row> rows;
  if (want("char") && char_new > 0) {
    bench_gpt("gpt char L6 H6 C384 T256 V65", gpt_shape(65, 256, 6, 6, 384), char_new, rows);
  }
  if (want("gpt2") && gpt2_new > 0) {
    bench_gpt("gpt2-small L12 H12 C768 T1024 V50257", gpt_shape(50257, 1024, 12, 12, 768), gpt2_new,
              rows);
  }
  if (want("bd3")) {
    for (int64_t bl : {4, 16}) {
      models::MdlmConfig c;
      c.vocab_size = 65;
      c.block_size = 256;
      c.n_layer = 6;
      c.n_head = 6;
      c.n_embd = 384;
      c.block_length = bl;
      std::ostringstream name;
      name << "bd3 L6 H6 C384 T256 V65 block " << bl << " x" << bd3_steps << " steps";
      bench_bd3(name.str(), c, bd3_num, bd3_steps, rows);
    }
  }

  if (json) {
    for (const auto& r : rows) {
      std::printf(
          "{\"engine\":\"starling\",\"what\":\"%s\",\"mode\":\"%s\",\"threads\":%d,\"tokens\":%lld,"
          "\"seconds\":%.4f,\"tokens_per_s\":%.2f,\"calls\":%lld,\"same_ids\":%s}\n",
          r.what.c_str(), r.mode.c_str(), omp_get_max_threads(), static_cast<long long>(r.tokens),
          r.seconds, static_cast<double>(r.tokens) / r.seconds, static_cast<long long>(r.calls),
          r.same ? "true" : "false");
    }
    return 0;
  }
  std::printf("%-44s %-9s %7s %9s %10s %6s %9s %8s\n", "model", "mode", "tokens", "seconds",
              "tokens/s", "calls", "speedup", "same ids");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    // Rows come in pairs (kv cache, no cache); the speedup is the pair's time ratio.
    const Row& base = rows[i % 2 == 0 ? i + 1 : i];
    std::printf("%-44s %-9s %7lld %9.3f %10.1f %6lld %8.2fx %8s\n", r.what.c_str(), r.mode.c_str(),
                static_cast<long long>(r.tokens), r.seconds,
                static_cast<double>(r.tokens) / r.seconds, static_cast<long long>(r.calls),
                base.seconds / r.seconds, r.same ? "yes" : "NO");
  }
  std::printf("threads: %d\n", omp_get_max_threads());
  return 0;
}
