// GptTrainer's local steps over the fused engine, on the CPU backend or a GPU.
#include "edge_client/fused_gpt_trainer.h"

#include <cmath>

#include "edge_client/model_params.h"
#include "models/gpt/fused_backend.h"

namespace starling::edge_client {
namespace {

compress::Layout layout_of_fused(const models::GptConfig& config) {
  compress::Layout layout;
  for (const auto& p : models::fused_gpt_layout(config)) {
    layout.push_back({p.name, p.shape, static_cast<int64_t>(p.offset)});
  }
  return layout;
}

Result<std::unique_ptr<models::FusedBackend>> make_backend(const FusedDevice& d) {
  if (!d.cuda) return models::make_fused_cpu_backend();
  return models::make_fused_cuda_backend(d.gpu);
}

}  // namespace

Result<std::unique_ptr<FusedGptTrainer>> FusedGptTrainer::create(
    std::shared_ptr<const std::vector<int32_t>> tokens, int64_t begin, int64_t end,
    GptTrainerOptions options, FusedDevice device) {
  if (options.optimizer != LocalStepOptions::Optimizer::kAdamW) {
    return failed_precondition(
        "key 'model.local_optimizer' must be \"ADAMW\" for a GPT trained by the fused engine "
        "(client.device \"cuda\"): the engine's optimizer is AdamW");
  }
  if (options.prox_mu > 0) {
    return failed_precondition(
        "key 'local.prox_mu' must be 0 for a GPT trained by the fused engine (client.device "
        "\"cuda\"): FedProx's term is applied by the SGD trainer only");
  }
  if (options.lora.enabled()) {
    return unimplemented(
        "[lora] is not supported by the fused engine (client.device \"cuda\") yet: LoRA "
        "clients train with the autograd engine on the CPU (client.device \"cpu\")");
  }
  if (options.context > 0 && options.context != options.model.block_size) {
    return unimplemented(
        "the fused engine (client.device \"cuda\") trains on windows of the "
        "model's whole position table; set model.block_size to the base's");
  }
  RETURN_IF_ERROR(models::check_fused_gpt_config(options.model, 1, options.model.block_size),
                  "fused GPT trainer");
  // The fused layout is models::Gpt's state-dict order and names: the federation's layout.
  compress::Layout layout = layout_of_fused(options.model);
  auto trainer = std::unique_ptr<FusedGptTrainer>(new FusedGptTrainer(
      std::move(tokens), begin, end, std::move(options), device, std::move(layout)));
  // Fail here, not in the first round, when the GPU is not there.
  ASSIGN_OR_RETURN(auto backend, make_backend(device));
  trainer->where_ = device.cuda ? "cuda:" + std::to_string(device.gpu) + " (" + backend->name() +
                                      ", fused engine)"
                                : "fused CPU engine";
  trainer->backend_ = std::move(backend);  // the first engine runs on it
  return trainer;
}

FusedGptTrainer::FusedGptTrainer(std::shared_ptr<const std::vector<int32_t>> tokens, int64_t begin,
                                 int64_t end, GptTrainerOptions options, FusedDevice device,
                                 compress::Layout layout)
    : tokens_(std::move(tokens)),
      begin_(begin),
      end_(end),
      options_(std::move(options)),
      device_(device),
      layout_(std::move(layout)) {}

Status FusedGptTrainer::ensure_engine(int64_t batch) {
  if (engine_ && engine_->batch() == batch) return ok_status();
  engine_.reset();  // the old buffers go before the new ones are allocated
  // Seed 0: the weights are overwritten by every round's global model.
  std::unique_ptr<models::FusedBackend> backend = std::move(backend_);
  if (!backend) {
    ASSIGN_OR_RETURN(backend, make_backend(device_));
  }
  ASSIGN_OR_RETURN(engine_, models::FusedGpt::make(options_.model, batch, options_.model.block_size,
                                                   0, std::move(backend)));
  return ok_status();
}

Result<TrainReport> FusedGptTrainer::train(std::span<const float> global, const v1::RoundPlan& plan,
                                           std::span<float> delta) {
  const int64_t T = options_.model.block_size;
  const int64_t n = end_ - begin_;
  RETURN_IF_ERROR(check_text_round(begin_, end_, tokens_->size(), T, plan));
  if (delta.size() != global.size()) return invalid_argument("delta and global sizes differ");
  const int64_t B = plan.batch_size();
  RETURN_IF_ERROR(ensure_engine(B));
  RETURN_IF_ERROR(engine_->load(layout_tensors(layout_, global)), "fused GPT trainer");
  engine_->reset_optimizer();  // fresh moments every round, as GptTrainer's AdamW
  const models::FusedOptimizer opt{options_.beta1, options_.beta2, 1e-8, options_.weight_decay};
  const int64_t steps = gpt_local_steps(n, T, options_.epochs, plan);
  if (steps <= 0) return invalid_argument("a round of " + std::to_string(steps) + " local steps");
  const int32_t* tok = tokens_->data() + begin_;
  std::vector<int32_t> x, y;
  Rng rng(plan.seed());  // the same stream, so the same windows, as GptTrainer
  double loss_sum = 0.0;
  for (int64_t step = 0; step < steps; ++step) {
    draw_windows(rng, tok, n, B, T, x, &y);
    ASSIGN_OR_RETURN(const auto r,
                     engine_->train_step(x.data(), y.data(), x.size(), plan.learning_rate(), opt,
                                         options_.grad_clip));
    if (!std::isfinite(r.loss)) {
      return internal_error("local training diverged at step " + std::to_string(step) + " (loss " +
                            std::to_string(r.loss) + "; lower local.learning_rate?)");
    }
    loss_sum += r.loss;
  }
  const std::vector<float> local = engine_->parameters_host();
  if (local.size() != global.size()) {
    return internal_error("fused GPT trainer: the engine holds " + std::to_string(local.size()) +
                          " parameters, the federation's model " + std::to_string(global.size()));
  }
  for (size_t i = 0; i < local.size(); ++i) delta[i] = local[i] - global[i];
  return TrainReport{static_cast<uint64_t>(n), static_cast<float>(loss_sum / steps)};
}

}  // namespace starling::edge_client
