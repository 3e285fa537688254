// The local trainer of masked-diffusion language-model clients: an MDLM (models/mdlm) trained on
// this client's slice of a token stream with the shared local step loop (SGD or AdamW).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/wire/config.pb.h"
#include "edge_client/edge_client.h"
#include "edge_client/local_steps.h"
#include "models/mdlm/mdlm.h"

namespace starling::edge_client {

struct MdlmTrainerOptions {
  models::MdlmConfig model;
  uint32_t epochs = 1;  // used when the plan's local_steps is 0 (counted as gpt_local_steps)
  LocalStepOptions steps;
};

// The `starling train` config of a federation's MDLM (model.arch = MDLM): [model] n_layer,
// n_head, n_embd, block_size and [model.diffusion], vocabulary `vocab`, dataset tinyshakespeare
// from [data] data_dir. Checkpoints of the federation carry it, so `starling sample` reads them.
v1::RunConfig mdlm_run_config(const v1::FederationConfig& config, int64_t vocab);
// The trainer options of that config ([local] epochs, local_step_options).
MdlmTrainerOptions mdlm_trainer_options(const v1::FederationConfig& config, int64_t vocab);

class MdlmTrainer : public LocalTrainer {
 public:
  // Trains on tokens[begin, end) of the shared stream, which must outlive the trainer.
  MdlmTrainer(std::shared_ptr<const std::vector<int32_t>> tokens, int64_t begin, int64_t end,
              MdlmTrainerOptions options);
  const compress::Layout& layout() const override { return layout_; }
  // Each step takes plan.batch_size windows of T tokens starting uniformly at random in this
  // client's slice, draws their diffusion times and corruption, and steps on the NELBO; the
  // plan's seed drives every draw. num_samples is the client's token count.
  // FailedPrecondition when the slice holds no window of T + 1 tokens.
  Result<TrainReport> train(std::span<const float> global, const v1::RoundPlan& plan,
                            std::span<float> delta) override;

 private:
  std::shared_ptr<const std::vector<int32_t>> tokens_;
  int64_t begin_;
  int64_t end_;
  MdlmTrainerOptions options_;
  models::Mdlm model_;
  compress::Layout layout_;
};

}  // namespace starling::edge_client
