// The shared local step loop of the diffusion trainers.
#include "edge_client/local_steps.h"

#include <cmath>
#include <memory>
#include <string>

#include "core/autograd/autograd.h"
#include "core/optim/optimizer.h"
#include "edge_client/model_params.h"

namespace starling::edge_client {

LocalStepOptions local_step_options(const v1::FederationConfig& c) {
  LocalStepOptions o;
  o.optimizer = c.model().local_optimizer() == v1::FedModelConfig::ADAMW
                    ? LocalStepOptions::Optimizer::kAdamW
                    : LocalStepOptions::Optimizer::kSgd;
  o.prox_mu = c.local().prox_mu();
  o.grad_clip = c.model().grad_clip();
  o.beta1 = c.model().adamw_beta1();
  o.beta2 = c.model().adamw_beta2();
  o.weight_decay = c.model().adamw_weight_decay();
  return o;
}

Status check_step_loss(int64_t step, double loss) {
  if (std::isfinite(loss)) return ok_status();
  return internal_error("local training diverged at step " + std::to_string(step) + " (loss " +
                        std::to_string(loss) + "; lower local.learning_rate?)");
}

Result<float> run_local_steps(nn::Module& model, std::span<const float> global,
                              const v1::RoundPlan& plan, int64_t steps,
                              const LocalStepOptions& options, const BatchLoss& batch_loss,
                              std::span<float> delta) {
  if (delta.size() != global.size()) return invalid_argument("delta and global sizes differ");
  if (steps <= 0) return invalid_argument("a round of " + std::to_string(steps) + " local steps");
  RETURN_IF_ERROR(load_flat(model, global));
  model.train(true);
  const auto params = model.trainable_parameters();
  std::unique_ptr<optim::Optimizer> adamw;
  if (options.optimizer == LocalStepOptions::Optimizer::kAdamW) {
    adamw = std::make_unique<optim::AdamW>(
        optim::decay_matrices_only(params),
        optim::AdamWOptions{options.beta1, options.beta2, 1e-8, options.weight_decay});
  }
  Rng rng(plan.seed());
  const float lr = plan.learning_rate();
  double loss_sum = 0.0;
  for (int64_t step = 0; step < steps; ++step) {
    model.zero_grad();
    Tensor loss = batch_loss(step, rng);
    const double loss_v = loss.item();
    RETURN_IF_ERROR(check_step_loss(step, loss_v));
    loss_sum += loss_v;
    autograd::backward(loss);
    if (options.grad_clip > 0) optim::clip_grad_norm(params, options.grad_clip);
    if (adamw) {
      adamw->step(lr);
      continue;
    }
    optim::sgd_prox_step(params, lr, options.prox_mu, global.data());
  }
  model.zero_grad();  // the gradients are not kept between rounds
  const auto local = flatten(model);
  for (size_t i = 0; i < local.size(); ++i) delta[i] = local[i] - global[i];
  return static_cast<float>(loss_sum / static_cast<double>(steps));
}

}  // namespace starling::edge_client
