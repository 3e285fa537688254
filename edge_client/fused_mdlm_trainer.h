// The MDLM client trainer on the fused engine (models/mdlm/fused_engine.h): the same windows,
// corruption, steps, clipping and AdamW (fresh moments every round) as MdlmTrainer with
// model.local_optimizer ADAMW, on the CPU backend or on a GPU, where the trunk, its gradients
// and the AdamW state stay across rounds and only the loss and the gradient norm come back per
// step. What `[client] device = "cuda"` runs for model.arch MDLM (one GPU per client).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "edge_client/edge_client.h"
#include "edge_client/fused_gpt_trainer.h"
#include "edge_client/mdlm_trainer.h"
#include "models/mdlm/fused_engine.h"

namespace starling::edge_client {

class FusedMdlmTrainer : public LocalTrainer {
 public:
  // Trains on tokens[begin, end) of the shared stream. Refused, naming the key: the SGD local
  // optimizer, local.prox_mu > 0, what the fused MDLM does not run (uniform noise, dropout:
  // models::check_fused_mdlm_config), several GPUs; the backend's error when the GPU is missing.
  static Result<std::unique_ptr<FusedMdlmTrainer>> create(
      std::shared_ptr<const std::vector<int32_t>> tokens, int64_t begin, int64_t end,
      MdlmTrainerOptions options, FusedDevice device);

  const compress::Layout& layout() const override { return layout_; }
  // MdlmTrainer::train's windows, times and masks (the plan's seed draws them in the same
  // order), AdamW at the plan's learning rate from zeroed moments, clipping at grad_clip.
  Result<TrainReport> train(std::span<const float> global, const v1::RoundPlan& plan,
                            std::span<float> delta) override;
  const std::string& where() const { return where_; }

 private:
  FusedMdlmTrainer(std::shared_ptr<const std::vector<int32_t>> tokens, int64_t begin, int64_t end,
                   MdlmTrainerOptions options, FusedDevice device);

  std::shared_ptr<const std::vector<int32_t>> tokens_;
  int64_t begin_;
  int64_t end_;
  MdlmTrainerOptions options_;
  FusedDevice device_;
  compress::Layout layout_;  // the trunk's (layout_of_fused), equal to models::Mdlm's
  std::string where_;
  std::unique_ptr<models::FusedBackend> backend_;  // made by create(), taken by the first engine
  std::unique_ptr<models::FusedMdlm> engine_;
};

}  // namespace starling::edge_client
