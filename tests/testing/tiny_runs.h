// Tiny training runs for trainer tests: a structured toy corpus written to <dir>/text.txt, the
// [data] and [train] sections every engine-parity test shares (10 steps of 4 windows, clipping,
// evaluation every 5), and the run's metrics.jsonl read back line by line.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config/toml_config.h"
#include "core/util/rng.h"
#include "core/wire/config.pb.h"

namespace starling::testing {

// A text of n characters from a small alphabet with some structure to learn.
inline std::string tiny_corpus(size_t n) {
  const std::string words[] = {"the ", "cat ", "sat ", "on ", "a ", "mat.\n", "dog ", "ran "};
  Rng rng(5);
  std::string s;
  while (s.size() < n) s += words[rng.below(8)];
  return s;
}

// `model_toml` (the [model] section and any other, e.g. [diffusion]) followed by a 10-step run on
// tiny_corpus(4000) in <dir>/text.txt, writing to <dir>/<out>; parsed as `starling train` does.
inline v1::RunConfig tiny_text_run(const std::filesystem::path& dir, const std::string& out,
                                   const std::string& model_toml) {
  std::ofstream(dir / "text.txt") << tiny_corpus(4000);
  const std::string toml = model_toml + R"(
[data]
path = ")" + (dir / "text.txt").string() +
                           R"("
data_dir = ")" + dir.string() +
                           R"("
tokenizer = "char"
val_fraction = 0.2
[train]
batch_size = 4
max_iters = 10
learning_rate = 3e-3
min_lr = 3e-4
warmup_iters = 3
lr_decay_iters = 8
weight_decay = 0.1
grad_clip = 0.5
eval_interval = 5
eval_iters = 2
log_interval = 1
seed = 99
threads = 1
out_dir = ")" + (dir / out).string() +
                           R"("
)";
  v1::RunConfig cfg;
  const Status st = config::parse_toml(toml, "tiny_run.toml", &cfg);
  if (!st.ok()) throw std::runtime_error(st.to_string());
  return cfg;
}

// Every line of a metrics.jsonl as JSON.
inline std::vector<nlohmann::json> read_metrics(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

// What compare_engine_metrics saw.
struct MetricsCompared {
  int train_lines = 0;
  int clipped = 0;  // train lines whose gradient norm exceeded 0.5 (tiny_text_run's clip)
  int finals = 0;   // whole-split evaluations
};

// Checks that two runs' metrics.jsonl (the autograd engine's `a`, the fused engine's `f`) agree
// line by line: the same events and iterations; train losses within 1e-4, learning rates equal,
// gradient norms within 1e-4 relative, the fused lines marked "engine":"fused"; evaluations and
// the final whole-split loss within 1e-4.
inline MetricsCompared compare_engine_metrics(const std::filesystem::path& a,
                                              const std::filesystem::path& f) {
  const auto ma = read_metrics(a);
  const auto mf = read_metrics(f);
  REQUIRE(ma.size() == mf.size());
  MetricsCompared out;
  auto close = [](const nlohmann::json& x, const nlohmann::json& y, const char* key) {
    return std::abs(x[key].get<double>() - y[key].get<double>()) <= 1e-4;
  };
  for (size_t i = 0; i < ma.size(); ++i) {
    INFO("line " << i << ": " << ma[i].dump() << " vs " << mf[i].dump());
    REQUIRE(ma[i]["event"] == mf[i]["event"]);
    REQUIRE(ma[i]["iter"] == mf[i]["iter"]);
    if (ma[i]["event"] == "train") {
      ++out.train_lines;
      CHECK(mf[i]["engine"] == "fused");
      CHECK(close(ma[i], mf[i], "loss"));
      CHECK(ma[i]["lr"].get<double>() == mf[i]["lr"].get<double>());
      CHECK(mf[i]["grad_norm"].get<double>() ==
            Approx(ma[i]["grad_norm"].get<double>()).epsilon(1e-4));
      if (ma[i]["grad_norm"].get<double>() > 0.5) ++out.clipped;
    } else if (ma[i]["event"] == "final") {
      ++out.finals;
      CHECK(ma[i]["windows"] == mf[i]["windows"]);
      CHECK(close(ma[i], mf[i], "val_loss_full"));
    } else {
      CHECK(close(ma[i], mf[i], "val_loss"));
      CHECK(close(ma[i], mf[i], "train_loss"));
    }
  }
  return out;
}

}  // namespace starling::testing
