// The MDLM training loop (train_gpt's shape: AdamW/SGD, warmup + cosine LR, clipping, periodic
// evaluation, logs, metrics.jsonl, safetensors checkpoints), the deterministic NELBO evaluation
// in bits per token, and sampling from a checkpoint.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "core/util/status.h"
#include "core/wire/config.pb.h"
#include "models/gpt/trainer.h"
#include "models/mdlm/mdlm.h"

namespace starling::models {

// Deterministic NELBO estimate in nats per token over `num_seqs` windows of block_size tokens
// evenly spaced over `tokens`, with one time per diffusion block (per window for MDLM) from the
// stratified grid eps + (1 - eps)(k + 1/2)/n, n = num_seqs * num_blocks (assigned by a
// permutation drawn from `seed`), and the corruption drawn from `seed`, run `batch` windows at a
// time in eval mode. With count masking the grid gives each block's masked count instead
// (k = 1 + floor(L (k' + 1/2)/n), Mdlm::corrupt_count). The same arguments give the same value,
// so evaluations of different runs compare.
// With `denoise_accuracy`, also stores the fraction of corrupted positions (x_t != x_0) whose
// argmax prediction is x_0 (one more forward pass per batch; 0 when nothing was corrupted).
// REQUIRES: tokens.size() >= block_size, num_seqs > 0, batch > 0.
// `masking` overrides the model's estimator (absorbing noise only).
double mdlm_eval_nelbo(Mdlm& model, std::span<const int32_t> tokens, int64_t num_seqs,
                       int64_t batch, uint64_t seed, double* denoise_accuracy = nullptr,
                       std::optional<MaskSampling> masking = std::nullopt);

// The whole-split NELBO of `starling eval` and of the end of training: every non-overlapping
// window of block_size tokens (num_seqs = tokens / block_size), the fixed evaluation seed unless
// `seed` is given.
double mdlm_eval_full(Mdlm& model, std::span<const int32_t> tokens, int64_t batch,
                      std::optional<uint64_t> seed = std::nullopt,
                      std::optional<MaskSampling> masking = std::nullopt);

// The NELBO of one corrupted batch: x0, xt (b, T) i32 and one time per diffusion block, as
// Mdlm::loss(x0, t, xt) in eval mode without gradients.
using MdlmBatchLoss =
    std::function<Result<double>(const Tensor& x0, std::span<const double> t, const Tensor& xt)>;
// mdlm_eval_nelbo and mdlm_eval_full with each batch's NELBO from `batch_loss` (an engine's) and
// `model` drawing the times and masks only (its weights are not read): the same windows, times,
// masks and therefore the same value as the autograd versions for the same weights.
Result<double> mdlm_eval_nelbo(const Mdlm& model, std::span<const int32_t> tokens, int64_t num_seqs,
                               int64_t batch, uint64_t seed, const MdlmBatchLoss& batch_loss,
                               std::optional<MaskSampling> masking = std::nullopt);
Result<double> mdlm_eval_full(const Mdlm& model, std::span<const int32_t> tokens, int64_t batch,
                              const MdlmBatchLoss& batch_loss,
                              std::optional<uint64_t> seed = std::nullopt,
                              std::optional<MaskSampling> masking = std::nullopt);

// The engine under train_mdlm's loop (GptEngine's counterpart): one training step and the NELBO
// of an evaluation batch. The loop owns data, batches, the noise stream, schedule, evaluation,
// logs, metrics and checkpoints; the default engine is the autograd Mdlm with core/optim,
// models/mdlm/fused_engine.h has the fused one (CPU or CUDA).
class MdlmEngine {
 public:
  struct Step {
    double loss = 0.0;       // the step's NELBO estimate, before the update
    double grad_norm = 0.0;  // before clipping
  };
  virtual ~MdlmEngine() = default;
  // Appended to the "model: ..." log line, e.g. "fused engine on cuda:0".
  virtual std::string describe() const = 0;
  virtual int64_t num_parameters() const = 0;
  // One optimizer step on clean sequences x0 (B, T) i32: the corruption drawn from `noise_rng`
  // exactly as Mdlm::loss(x0, noise_rng) draws it, gradients clipped to `grad_clip` (0: none),
  // then the update at `lr`. A non-finite loss is returned as such (the loop stops on it).
  virtual Result<Step> step(const Tensor& x0, Rng& noise_rng, double lr, double grad_clip) = 0;
  // The NELBO of a corrupted batch of at most B rows (MdlmBatchLoss), eval mode, no gradients.
  virtual Result<double> eval_loss(const Tensor& x0, std::span<const double> t,
                                   const Tensor& xt) = 0;
  // The current weights as a host Mdlm, for checkpoints and for drawing evaluation masks (valid
  // until the next step).
  virtual Result<const Mdlm*> host_model() = 0;
  // Extra JSON fields for the metrics' train lines (",\"engine\":\"fused\"..."), or "".
  virtual std::string metrics_fields() const { return ""; }
};
// Builds the engine once the tokenizer fixed the vocabulary.
using MdlmEngineFactory =
    std::function<Result<std::unique_ptr<MdlmEngine>>(const MdlmConfig&, const v1::RunConfig&)>;

// Trains the MDLM described by `config` (model.arch = MDLM; read from `config_source`, named in
// errors). Writes <out_dir>/ckpt.safetensors (last), best.safetensors (lowest val NELBO),
// metrics.jsonl and config.toml. TrainSummary losses are NELBO in nats per token; the logs and
// metrics also give them in bits per token (bits per character for the char tokenizer). `make`
// builds the engine (empty: the autograd Mdlm with core/optim's AdamW or SGD).
Result<TrainSummary> train_mdlm(const v1::RunConfig& config, const std::string& config_source,
                                const MdlmEngineFactory& make = {});

// Loads an MDLM checkpoint and draws `num_samples` sequences of block_size tokens with the
// ancestral sampler (cached when [diffusion].cached_sampler), `steps` steps (<= 0: the
// checkpoint's [diffusion].sampling_steps), `temperature`, Rng(seed). Returns the decoded
// samples separated by "\n---\n"; logs the network calls the cache saved and the speed.
// `kv_cache`: the block-diffusion KV cache (Mdlm::sample); unset takes the checkpoint's
// [sample].kv_cache.
Result<std::string> sample_mdlm_checkpoint(const std::filesystem::path& path, int64_t steps,
                                           double temperature, uint64_t seed,
                                           int64_t num_samples = 1,
                                           std::optional<bool> kv_cache = std::nullopt);

}  // namespace starling::models
