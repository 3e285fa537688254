// The local trainer of language-model clients: a char GPT (models/gpt) trained with minibatch
// SGD (gradient clipping, FedProx's proximal term) or AdamW on this client's slice of a token
// stream.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/util/rng.h"
#include "edge_client/edge_client.h"
#include "edge_client/local_steps.h"
#include "models/gpt/gpt.h"
#include "models/gpt/lora.h"

namespace starling::edge_client {

struct GptTrainerOptions {
  models::GptConfig model;
  uint32_t epochs = 1;     // used when the plan's local_steps is 0
  float prox_mu = 0.0f;    // FedProx: gradient += mu (w - w_global)
  float grad_clip = 1.0f;  // global gradient norm clip per step; 0: none
  // [model] local_optimizer: SGD, or AdamW with fresh moments every round (adamw_*).
  LocalStepOptions::Optimizer optimizer = LocalStepOptions::Optimizer::kSgd;
  float beta1 = 0.9f;
  float beta2 = 0.99f;
  float weight_decay = 0.0f;
  // Fine-tuning: the pretrained weights (`model` is its config), shared read-only by every
  // trainer; null: the global model alone defines the weights.
  std::shared_ptr<const models::Gpt> base;
  // LoRA ([lora]): the base frozen, adapters trained; the trainer's layout is the adapters'.
  models::LoraSpec lora;
  // Tokens per training window; 0: model.block_size (a pretrained model's position table may
  // be longer than the context a client trains on).
  int64_t context = 0;

  int64_t window() const { return context > 0 ? context : model.block_size; }
};

// Local steps of a round: the plan's local_steps, else epochs passes of ceil(windows / batch)
// steps, where a client with n tokens holds floor((n - 1) / T) disjoint windows of T.
int64_t gpt_local_steps(int64_t num_tokens, int64_t block_size, uint32_t epochs,
                        const v1::RoundPlan& plan);

// Whether a round of a language-model trainer on tokens [begin, end) of a stream of `size`
// tokens can run: at least one window of T + 1 tokens and a positive batch size.
Status check_text_round(int64_t begin, int64_t end, size_t size, int64_t block_size,
                        const v1::RoundPlan& plan);

// One step's windows: B starts drawn uniformly from [0, n - T) with `rng`, x the T tokens from
// each start and y (when not null) the T tokens after them, row-major (B, T). Every text trainer
// draws its batches this way, so the same plan gives the same windows on any engine.
void draw_windows(Rng& rng, const int32_t* tokens, int64_t n, int64_t B, int64_t T,
                  std::vector<int32_t>& x, std::vector<int32_t>* y);

class GptTrainer : public LocalTrainer {
 public:
  // Trains on tokens[begin, end) of the shared stream. The stream must outlive the trainer.
  // REQUIRES: end - begin > options.model.block_size (one window and its target).
  GptTrainer(std::shared_ptr<const std::vector<int32_t>> tokens, int64_t begin, int64_t end,
             GptTrainerOptions options);
  const compress::Layout& layout() const override { return layout_; }
  // Each step takes plan.batch_size windows of T tokens starting uniformly at random in this
  // client's slice (the plan's seed drives them, so a round repeats bit for bit) and makes one
  // SGD step with plan.learning_rate. num_samples is the client's token count.
  Result<TrainReport> train(std::span<const float> global, const v1::RoundPlan& plan,
                            std::span<float> delta) override;

 private:
  std::shared_ptr<const std::vector<int32_t>> tokens_;
  int64_t begin_;
  int64_t end_;
  GptTrainerOptions options_;
  std::unique_ptr<models::Gpt> model_;  // null when it could not be made (init_ says why)
  Status init_;
  compress::Layout layout_;
};

}  // namespace starling::edge_client
