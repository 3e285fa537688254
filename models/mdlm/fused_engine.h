// FusedMdlm: the absorbing-noise MDLM of models/mdlm/mdlm.h trained on the fused engine
// (models/gpt/fused_gpt.h, CPU or CUDA backend). The corruption stays on the host: a models::Mdlm
// draws times and masks; the bidirectional trunk with V + 1 embeddings runs as a FusedGpt whose
// loss reads the first V logits with weights (1/t) / (B*T) on the masked positions. Learned or
// rotary positions; block diffusion runs the trunk on rows [x_t | x_0] of 2T under
// ops::AttnMask::block_diffusion, the loss on the x_t half. Also the fused MdlmEngine of
// train_mdlm (`starling train` with train.engine = "fused" or --device cuda).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/io/state_dict.h"
#include "core/util/rng.h"
#include "core/util/status.h"
#include "core/wire/config.pb.h"
#include "models/gpt/fused_gpt.h"
#include "models/gpt/fused_trainer.h"
#include "models/mdlm/mdlm.h"
#include "models/mdlm/trainer.h"

namespace starling::models {

// Why the fused engine cannot train `config` with `batch` sequences per step, naming the key:
// uniform noise (diffusion.noise), dropout (model.dropout); or the trunk's shape checks
// (check_fused_gpt_config). Ok for the MDLM and block diffusion (any diffusion.block_length),
// learned or rotary positions, either masking (bernoulli or count, antithetic too).
Status check_fused_mdlm_config(const MdlmConfig& config, int64_t batch);
// The trunk's attention: full, or with block diffusion (0 < block_length < block_size)
// ops::AttnMask::block_diffusion(block_length) over [x_t | x_0] (2T positions, period T).
ops::AttnMask fused_mdlm_attn_mask(const MdlmConfig& config);

class FusedMdlm {
 public:
  // A FusedMdlm for `batch` sequences per training step on `backend`, with the weights of
  // models::Mdlm(config, seed) (the same values). With antithetic masks a step runs 2 * batch
  // rows. Refusals: check_fused_mdlm_config.
  static Result<std::unique_ptr<FusedMdlm>> make(const MdlmConfig& config, int64_t batch,
                                                 uint64_t seed,
                                                 std::unique_ptr<FusedBackend> backend);

  const MdlmConfig& config() const { return config_; }
  int64_t batch() const { return batch_; }
  // The most rows one call takes: batch, or 2 * batch with antithetic masks.
  int64_t rows() const { return trunk_->batch(); }
  FusedGpt& trunk() { return *trunk_; }
  int64_t num_parameters() const { return static_cast<int64_t>(trunk_->num_parameters()); }

  // Mdlm::loss(x0, t, xt): the NELBO per token of x0 (b, T) i32 given its corruption xt (b, T)
  // i32 at times t (b * num_blocks values in (0, 1], one per diffusion block), b <= rows(): sum
  // over masked positions of (1/t) * -log p(x0 | xt), t of the position's block, divided by
  // b * T. Forward only. Bad shapes, ids or times: InvalidArgument naming them.
  Result<double> loss(const Tensor& x0, std::span<const double> t, const Tensor& xt);
  // The same, with the gradients of every weight left in trunk().gradients_host().
  Result<double> forward_backward(const Tensor& x0, std::span<const double> t, const Tensor& xt);
  // Draws the corruption of x0 (B, T) from `rng` exactly as Mdlm::loss(x0, rng) does
  // (sample_times + corrupt, or corrupt_count and with antithetic masks antithetic_pair, of the
  // host model) -> the rows to train on: x0 (twice with antithetic masks), xt and t.
  struct Draw {
    Tensor x0;
    NoisedBatch noised;
  };
  Draw draw(const Tensor& x0, Rng& rng) const;
  // One training step on x0 (batch, T): draw(x0, rng), forward, backward, global-norm clipping
  // at grad_clip (0: none), AdamW at lr. Returns the NELBO estimate (Mdlm::loss(x0, rng)'s
  // value) and the gradient norm before clipping.
  Result<FusedStepResult> train_step(const Tensor& x0, Rng& rng, double lr,
                                     const FusedOptimizer& opt, double grad_clip);

  // Copies weights in: models::Mdlm's state dict (transformer.wte.weight with V + 1 rows, ...).
  // A missing, unknown or misshapen tensor is InvalidArgument naming it.
  Status load(const io::StateDict& sd) { return trunk_->load(sd); }
  // The weights as models::Mdlm's state dict.
  io::StateDict state_dict() { return trunk_->state_dict(); }
  // The host Mdlm with the current fused weights copied in (checkpoints, sampling), valid until
  // the next step. It also draws the corruption, which does not read the weights.
  Result<const Mdlm*> host_model();

 private:
  FusedMdlm(const MdlmConfig& config, int64_t batch, uint64_t seed);
  // Host staging of (x0, t, xt) into the trunk's batch: xt as inputs (then x0 with block
  // diffusion: rows of 2T), x0 as targets at the masked positions of xt (-1 elsewhere and on the
  // whole x0 half), weights (1/t) / (b*T); rows b.. of the trunk's batch are padding with every
  // target ignored.
  // `pad`: fill the engine's rows() with ignored rows (training needs them all); else only b.
  Result<FusedBatch> stage(const Tensor& x0, std::span<const double> t, const Tensor& xt,
                           bool pad = true);

  MdlmConfig config_;
  int64_t batch_;
  std::unique_ptr<Mdlm> host_;
  std::unique_ptr<FusedGpt> trunk_;
  std::vector<int32_t> idx_, targets_;
  std::vector<float> weights_;
};

// The fused engine for train_mdlm: the checks above and train.optimizer = "adamw", then a
// FusedMdlm on the CPU or CUDA backend (options.cuda, options.gpu); train.precision = "bf16"
// runs its linear layers in bf16 as for the GPT.
MdlmEngineFactory fused_mdlm_engine_factory(const FusedTrainOptions& options);

// train_mdlm over the fused engine: the same outputs (ckpt.safetensors, best.safetensors,
// metrics.jsonl, config.toml), read by `starling sample` and `starling eval` as usual.
// REQUIRES: config.model().arch() is MDLM (else InvalidArgument).
Result<TrainSummary> train_mdlm_fused(const v1::RunConfig& config, const std::string& config_source,
                                      const FusedTrainOptions& options);

}  // namespace starling::models
