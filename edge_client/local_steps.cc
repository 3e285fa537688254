// The shared local step loop of the diffusion trainers.
#include "edge_client/local_steps.h"

#include <cmath>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/autograd/autograd.h"
#include "core/ops/elementwise.h"
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

Result<ProxSgd> ProxSgd::create(std::vector<Tensor> params, std::span<const float> global,
                                float mu) {
  ProxSgd out;
  out.params_ = std::move(params);
  out.global_ = global;
  out.mu_ = mu;
  if (out.params_.empty() || out.params_.front().is_cpu()) return out;
  // On a device: core/optim's Sgd (w -= lr g', sgd_prox_step's arithmetic), FedProx's term added
  // to the gradients there, against a copy of the global model made once per round.
  out.sgd_ =
      std::make_unique<optim::Sgd>(optim::decay_matrices_only(out.params_), optim::SgdOptions{});
  if (mu > 0) {
    size_t at = 0;
    for (const Tensor& p : out.params_) {
      const auto n = static_cast<size_t>(p.numel());
      if (at + n > global.size()) return invalid_argument("global model shorter than the model");
      std::vector<float> w0(global.begin() + static_cast<std::ptrdiff_t>(at),
                            global.begin() + static_cast<std::ptrdiff_t>(at + n));
      ASSIGN_OR_RETURN(Tensor a, Tensor::from_vector(w0, p.shape()).to(p.device()));
      out.anchor_.push_back(a);
      at += n;
    }
  }
  return out;
}

void ProxSgd::step(float lr) {
  if (!sgd_) {
    optim::sgd_prox_step(params_, lr, mu_, global_.data());
    return;
  }
  if (mu_ > 0) {
    autograd::NoGradGuard ng;
    for (size_t i = 0; i < params_.size(); ++i) {
      Tensor p = params_[i];
      if (!p.grad().defined()) continue;
      p.set_grad(ops::add(p.grad(), ops::mul_scalar(ops::sub(p.detach(), anchor_[i]), mu_)));
    }
  }
  sgd_->step(lr);
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
  std::optional<ProxSgd> sgd;
  if (!adamw) {
    ASSIGN_OR_RETURN(ProxSgd made, ProxSgd::create(params, global, options.prox_mu));
    sgd.emplace(std::move(made));
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
    sgd->step(lr);
  }
  model.zero_grad();  // the gradients are not kept between rounds
  const auto local = flatten(model);
  for (size_t i = 0; i < local.size(); ++i) delta[i] = local[i] - global[i];
  return static_cast<float>(loss_sum / static_cast<double>(steps));
}

}  // namespace starling::edge_client
