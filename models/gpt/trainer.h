// The local language-model training loop: data -> GPT -> AdamW/SGD with warmup + cosine LR,
// periodic train/val evaluation, progress logs (step, loss, tokens/s, ETA), JSON-lines metrics
// and safetensors checkpoints. `starling train` runs it; edge clients will reuse it.
#pragma once

#include <filesystem>
#include <functional>
#include <string>

#include "core/util/status.h"
#include "core/wire/config.pb.h"

namespace starling::models {

struct TrainSummary {
  int64_t iters = 0;
  double train_loss = 0.0;  // last evaluation
  double val_loss = 0.0;    // last evaluation
  double best_val_loss = 0.0;
  double seconds = 0.0;
  double tokens_per_second = 0.0;
  std::filesystem::path checkpoint;
};

// Trains the GPT described by `config` (read from `config_source`, named in errors).
// Writes <out_dir>/ckpt.safetensors (last), <out_dir>/best.safetensors (lowest val loss),
// <out_dir>/metrics.jsonl and <out_dir>/config.toml (the effective config).
Result<TrainSummary> train_gpt(const v1::RunConfig& config, const std::string& config_source);

}  // namespace starling::models
