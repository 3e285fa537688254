// The local language-model training loop: data -> GPT -> AdamW/SGD with warmup + cosine LR,
// periodic train/val evaluation, progress logs (step, loss, tokens/s, ETA), JSON-lines metrics
// and safetensors checkpoints. `starling train` runs it; edge clients will reuse it.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/data/text_dataset.h"
#include "core/optim/optimizer.h"
#include "core/util/status.h"
#include "core/wire/config.pb.h"
#include "models/gpt/gpt.h"

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

// The engine under train_gpt's loop: what one training step and one evaluation batch do. The
// loop owns data, batches, schedule, evaluation cadence, logs, metrics and checkpoints; the
// default engine is the autograd Gpt, models/gpt/fused_trainer.h has the fused one (CPU or
// CUDA).
class GptEngine {
 public:
  struct Step {
    double loss = 0.0;       // before the update
    double grad_norm = 0.0;  // before clipping
  };
  virtual ~GptEngine() = default;
  // Appended to the "model: ..." log line, e.g. "fused engine on cuda:0".
  virtual std::string describe() const = 0;
  virtual int64_t num_parameters() const = 0;
  // One optimizer step at `lr` with gradients clipped to `grad_clip` (0: none).
  virtual Result<Step> step(const data::Batch& batch, double lr, double grad_clip) = 0;
  // Mean loss of a batch in eval mode, without gradients.
  virtual Result<double> eval_loss(const data::Batch& batch) = 0;
  // The current weights as a host Gpt, for checkpoints (valid until the next step).
  virtual Result<const Gpt*> host_model() = 0;
  // Extra JSON fields for the metrics' train lines (",\"engine\":\"fused\"..."), or "".
  virtual std::string metrics_fields() const { return ""; }
};
// Builds the engine once the tokenizer fixed the vocabulary.
using GptEngineFactory =
    std::function<Result<std::unique_ptr<GptEngine>>(const GptConfig&, const v1::RunConfig&)>;

// The optimizer of every autograd trainer (GPT, MDLM, train --ranks): core/optim's AdamW, or SGD
// with momentum for train.optimizer = "sgd", over `params` with weight decay on the matrices only
// (optim::decay_matrices_only).
std::unique_ptr<optim::Optimizer> make_optimizer(const std::vector<Tensor>& params,
                                                 const v1::TrainConfig& tc);

// One step of an autograd trainer on the scalar `loss` over `params`: backward, global-norm
// clipping at grad_clip, opt.step(lr), zero grads. Returns the loss and the norm before
// clipping; a non-finite loss comes back with norm 0 and the weights untouched (the loop stops).
struct AutogradStep {
  double loss = 0.0;
  double grad_norm = 0.0;
};
AutogradStep autograd_step(const Tensor& loss, const std::vector<Tensor>& params,
                           optim::Optimizer& opt, double lr, double grad_clip);

// Mean next-token loss over a whole split: every non-overlapping window of t inputs and its t
// shifted targets, b windows per batch (a final partial batch is left out: an engine may be
// built for exactly b rows); `batch_loss` gives a batch's mean loss. Returns {loss, windows}.
Result<std::pair<double, int64_t>> full_split_loss(
    std::span<const int32_t> tokens, int64_t b, int64_t t,
    const std::function<Result<double>(const data::Batch&)>& batch_loss);

// Trains the GPT described by `config` (read from `config_source`, named in errors) with the
// engine `make` builds (empty: the autograd Gpt with core/optim's AdamW or SGD).
// Writes <out_dir>/ckpt.safetensors (last), <out_dir>/best.safetensors (lowest val loss),
// <out_dir>/metrics.jsonl and <out_dir>/config.toml (the effective config).
Result<TrainSummary> train_gpt(const v1::RunConfig& config, const std::string& config_source,
                               const GptEngineFactory& make = {});

}  // namespace starling::models
