#include "edge_client/fused_mdlm_trainer.h"

#include <cmath>
#include <string>

#include "edge_client/gpt_trainer.h"
#include "edge_client/local_steps.h"
#include "edge_client/model_params.h"

namespace starling::edge_client {

Result<std::unique_ptr<FusedMdlmTrainer>> FusedMdlmTrainer::create(
    std::shared_ptr<const std::vector<int32_t>> tokens, int64_t begin, int64_t end,
    MdlmTrainerOptions options, FusedDevice device) {
  if (options.steps.optimizer != LocalStepOptions::Optimizer::kAdamW) {
    return failed_precondition(
        "key 'model.local_optimizer' must be \"ADAMW\" for an MDLM trained by the fused engine "
        "(client.device \"cuda\"): the engine's optimizer is AdamW");
  }
  if (options.steps.prox_mu > 0) {
    return failed_precondition(
        "key 'local.prox_mu' must be 0 for an MDLM trained by the fused engine (client.device "
        "\"cuda\"): FedProx's term is applied by the SGD trainer only");
  }
  if (device.ranks() > 1) {
    return unimplemented(
        "key 'client.gpus' names " + std::to_string(device.ranks()) +
        " GPUs: an MDLM client trains on one (several GPUs per client train model.arch GPT; a "
        "simulation spreads its virtual clients over them)");
  }
  RETURN_IF_ERROR(models::check_fused_mdlm_config(options.model, 1),
                  "fused MDLM trainer (client.device \"cuda\")");
  auto trainer = std::unique_ptr<FusedMdlmTrainer>(
      new FusedMdlmTrainer(std::move(tokens), begin, end, std::move(options), device));
  // Fail here, not in the first round, when the GPU is not there.
  ASSIGN_OR_RETURN(trainer->backend_, make_fused_backend(device, 0));
  trainer->where_ = fused_device_name(device, *trainer->backend_);
  return trainer;
}

FusedMdlmTrainer::FusedMdlmTrainer(std::shared_ptr<const std::vector<int32_t>> tokens,
                                   int64_t begin, int64_t end, MdlmTrainerOptions options,
                                   FusedDevice device)
    : tokens_(std::move(tokens)),
      begin_(begin),
      end_(end),
      options_(std::move(options)),
      device_(std::move(device)),
      layout_(layout_of_fused(options_.model.trunk_config())) {}

Result<TrainReport> FusedMdlmTrainer::train(std::span<const float> global,
                                            const v1::RoundPlan& plan, std::span<float> delta) {
  const int64_t T = options_.model.block_size;
  const int64_t n = end_ - begin_;
  RETURN_IF_ERROR(check_text_round(begin_, end_, tokens_->size(), T, plan));
  if (delta.size() != global.size()) return invalid_argument("delta and global sizes differ");
  const int64_t B = plan.batch_size();
  const int64_t steps = gpt_local_steps(n, T, options_.epochs, plan);
  if (steps <= 0) return invalid_argument("a round of " + std::to_string(steps) + " local steps");
  if (!engine_ || engine_->batch() != B) {
    engine_.reset();  // the old buffers go before the new ones are allocated
    std::unique_ptr<models::FusedBackend> backend = std::move(backend_);
    if (!backend) {
      ASSIGN_OR_RETURN(backend, make_fused_backend(device_, 0));
    }
    // Seed 0: the weights are overwritten by every round's global model.
    ASSIGN_OR_RETURN(engine_, models::FusedMdlm::make(options_.model, B, 0, std::move(backend)));
  }
  RETURN_IF_ERROR(engine_->load(layout_tensors(layout_, global)), "fused MDLM trainer");
  engine_->trunk().reset_optimizer();  // fresh moments every round, as MdlmTrainer's AdamW
  const models::FusedOptimizer opt{options_.steps.beta1, options_.steps.beta2, 1e-8,
                                   options_.steps.weight_decay};
  const int32_t* tok = tokens_->data() + begin_;
  std::vector<int32_t> x;
  Rng rng(plan.seed());  // the same stream, so the same windows and corruption, as MdlmTrainer
  double loss_sum = 0.0;
  for (int64_t step = 0; step < steps; ++step) {
    draw_windows(rng, tok, n, B, T, x, nullptr);
    ASSIGN_OR_RETURN(const auto r,
                     engine_->train_step(Tensor::from_vector(x, {B, T}), rng, plan.learning_rate(),
                                         opt, options_.steps.grad_clip));
    RETURN_IF_ERROR(check_step_loss(step, r.loss));
    loss_sum += r.loss;
  }
  // The trunk's buffer is in the federation's layout (layout_of_fused).
  const std::vector<float> local = engine_->trunk().parameters_host();
  if (local.size() != global.size()) {
    return internal_error("fused MDLM trainer: the engine holds " + std::to_string(local.size()) +
                          " parameters, the federation's model " + std::to_string(global.size()));
  }
  for (size_t i = 0; i < local.size(); ++i) delta[i] = local[i] - global[i];
  return TrainReport{static_cast<uint64_t>(n), static_cast<float>(loss_sum / steps)};
}

}  // namespace starling::edge_client
