// The GPT client trainer on the fused engine (models/gpt/fused_gpt.h): the same windows, steps,
// clipping and AdamW (fresh moments every round) as GptTrainer, on the CPU backend or on a GPU
// (CUDA backend), where the model, its gradients and the AdamW state stay across rounds and only
// the loss and the gradient norm come back per step. What `[client] device = "cuda"` runs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "edge_client/edge_client.h"
#include "edge_client/gpt_trainer.h"
#include "models/gpt/fused_gpt.h"

namespace starling::edge_client {

struct FusedDevice {
  bool cuda = false;  // false: the fused CPU backend
  int gpu = 0;
};

class FusedGptTrainer : public LocalTrainer {
 public:
  // Trains on tokens[begin, end) of the shared stream. FailedPrecondition naming the key for
  // what the fused engine does not run (model.local_optimizer SGD, local.prox_mu > 0, dropout);
  // the backend's error when the GPU is missing. REQUIRES: end - begin > block_size.
  static Result<std::unique_ptr<FusedGptTrainer>> create(
      std::shared_ptr<const std::vector<int32_t>> tokens, int64_t begin, int64_t end,
      GptTrainerOptions options, FusedDevice device);

  const compress::Layout& layout() const override { return layout_; }
  // GptTrainer::train's windows and steps (the plan's seed draws them), AdamW with plan's
  // learning rate from zeroed moments, global-norm clipping at grad_clip.
  Result<TrainReport> train(std::span<const float> global, const v1::RoundPlan& plan,
                            std::span<float> delta) override;
  // Where it runs, e.g. "cuda:0 (NVIDIA H200)" or "fused CPU engine".
  const std::string& where() const { return where_; }

 private:
  FusedGptTrainer(std::shared_ptr<const std::vector<int32_t>> tokens, int64_t begin, int64_t end,
                  GptTrainerOptions options, FusedDevice device, compress::Layout layout);
  // The engine for batches of `batch` rows, made on first use and again when the batch changes.
  Status ensure_engine(int64_t batch);

  std::shared_ptr<const std::vector<int32_t>> tokens_;
  int64_t begin_;
  int64_t end_;
  GptTrainerOptions options_;
  FusedDevice device_;
  compress::Layout layout_;
  std::string where_;
  std::unique_ptr<models::FusedBackend> backend_;  // made by create(), taken by the first engine
  std::unique_ptr<models::FusedGpt> engine_;
};

}  // namespace starling::edge_client
