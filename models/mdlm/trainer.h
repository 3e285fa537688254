// The MDLM training loop (train_gpt's shape: AdamW/SGD, warmup + cosine LR, clipping, periodic
// evaluation, logs, metrics.jsonl, safetensors checkpoints), the deterministic NELBO evaluation
// in bits per token, and sampling from a checkpoint.
#pragma once

#include <cstdint>
#include <filesystem>
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

// Trains the MDLM described by `config` (model.arch = MDLM; read from `config_source`, named in
// errors). Writes <out_dir>/ckpt.safetensors (last), best.safetensors (lowest val NELBO),
// metrics.jsonl and config.toml. TrainSummary losses are NELBO in nats per token; the logs and
// metrics also give them in bits per token (bits per character for the char tokenizer).
Result<TrainSummary> train_mdlm(const v1::RunConfig& config, const std::string& config_source);

// Loads an MDLM checkpoint and draws `num_samples` sequences of block_size tokens with the
// ancestral sampler (cached when [diffusion].cached_sampler), `steps` steps (<= 0: the
// checkpoint's [diffusion].sampling_steps), `temperature`, Rng(seed). Returns the decoded
// samples separated by "\n---\n"; logs the network calls the cache saved.
Result<std::string> sample_mdlm_checkpoint(const std::filesystem::path& path, int64_t steps,
                                           double temperature, uint64_t seed,
                                           int64_t num_samples = 1);

}  // namespace starling::models
