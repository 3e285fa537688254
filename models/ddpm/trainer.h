// The DDPM training loop (AdamW/SGD, warmup + cosine LR, clipping, EMA, periodic deterministic
// evaluation, metrics.jsonl, safetensors checkpoints, a sample grid at the end), and sampling
// from a checkpoint with the optional classifier check.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "core/util/status.h"
#include "core/wire/config.pb.h"
#include "models/ddpm/ddpm.h"
#include "models/gpt/trainer.h"

namespace starling::models {

// Deterministic epsilon-MSE over `num` images of `images` ((N, C, H, W) in [-1, 1]) evenly
// spaced, with steps and noise drawn from Rng(seed), `batch` at a time, on the trained weights
// in eval mode. The same arguments give the same value.
double ddpm_eval_loss(Ddpm& model, const Tensor& images, int64_t num, int64_t batch, uint64_t seed);

// Trains the DDPM described by `config` (model.arch = DDPM; data.dataset "mnist" or
// "fashion-mnist"). Writes <out_dir>/ckpt.safetensors (last), best.safetensors (lowest val
// loss), metrics.jsonl, config.toml and samples.png (ddpm.num_samples images from the final
// weights). TrainSummary's losses are epsilon MSE; tokens_per_second holds images per second.
// device: where the U-Net trains (a GPU through the ops' device forms, its backend installed by
// the caller: cuda::install_tensor_backend()); batches are drawn on the host and moved there.
Result<TrainSummary> train_ddpm(const v1::RunConfig& config, const std::string& config_source,
                                Device device = Device::cpu());

struct DdpmSampleOptions {
  std::filesystem::path checkpoint;
  std::filesystem::path out_png;       // empty: <checkpoint dir>/samples.png
  int64_t num = 0;                     // 0: ddpm.num_samples
  int64_t steps = 0;                   // 0: ddpm.sampling_steps
  std::optional<std::string> sampler;  // "ddim" | "ancestral"; default ddpm.sampler
  std::optional<double> eta;           // DDIM eta; default ddpm.ddim_eta
  uint64_t seed = 1337;
  int64_t cols = 0;       // grid columns; 0: ceil(sqrt(num))
  bool classify = false;  // run the MNIST classifier check on the samples
  int64_t classifier_epochs = 2;
  std::string data_dir;  // for the classifier's data; empty: the config's
  Device device;         // where the network runs (its backend installed by the caller)
};

// Loads a DDPM checkpoint, samples, writes the PNG grid and returns a report (where the grid
// went, sampler settings, timing, and the classifier check when asked).
Result<std::string> sample_ddpm_checkpoint(const DdpmSampleOptions& o);

}  // namespace starling::models
