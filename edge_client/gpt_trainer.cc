// Local SGD of a char GPT on one client's text.
#include "edge_client/gpt_trainer.h"

#include <cmath>

#include "core/autograd/autograd.h"
#include "core/optim/optimizer.h"
#include "core/util/rng.h"
#include "edge_client/model_params.h"

namespace starling::edge_client {

int64_t gpt_local_steps(int64_t num_tokens, int64_t block_size, uint32_t epochs,
                        const v1::RoundPlan& plan) {
  if (plan.local_steps() > 0) return plan.local_steps();
  const int64_t windows = std::max<int64_t>(1, (num_tokens - 1) / block_size);
  const int64_t batch = std::max<int64_t>(1, plan.batch_size());
  return static_cast<int64_t>(epochs) * ((windows + batch - 1) / batch);
}

GptTrainer::GptTrainer(std::shared_ptr<const std::vector<int32_t>> tokens, int64_t begin,
                       int64_t end, GptTrainerOptions options)
    : tokens_(std::move(tokens)),
      begin_(begin),
      end_(end),
      options_(options),
      model_(options.model, 0),
      layout_(layout_of(model_)) {}

Result<TrainReport> GptTrainer::train(std::span<const float> global, const v1::RoundPlan& plan,
                                      std::span<float> delta) {
  const int64_t T = options_.model.block_size;
  const int64_t n = end_ - begin_;
  if (begin_ < 0 || end_ > static_cast<int64_t>(tokens_->size()) || n <= T) {
    return failed_precondition("this client has " + std::to_string(n) +
                               " tokens, fewer than one window of " + std::to_string(T + 1));
  }
  if (plan.batch_size() == 0) return invalid_argument("round plan with batch size 0");
  if (delta.size() != global.size()) return invalid_argument("delta and global sizes differ");
  RETURN_IF_ERROR(load_flat(model_, global));
  model_.train(true);
  const int64_t B = plan.batch_size();
  const int64_t steps = gpt_local_steps(n, T, options_.epochs, plan);
  const int32_t* tok = tokens_->data() + begin_;
  const auto params = model_.parameters();
  Rng rng(plan.seed());
  std::vector<int32_t> x(static_cast<size_t>(B * T)), y(x.size());
  double loss_sum = 0.0;
  for (int64_t step = 0; step < steps; ++step) {
    for (int64_t b = 0; b < B; ++b) {
      const auto start = static_cast<int64_t>(rng.below(static_cast<uint64_t>(n - T)));
      for (int64_t t = 0; t < T; ++t) {
        x[static_cast<size_t>(b * T + t)] = tok[start + t];
        y[static_cast<size_t>(b * T + t)] = tok[start + t + 1];
      }
    }
    model_.zero_grad();
    Tensor loss = model_.loss(Tensor::from_vector(x, {B, T}), Tensor::from_vector(y, {B, T}));
    const double loss_v = loss.item();
    if (!std::isfinite(loss_v)) {
      return internal_error("local training diverged at step " + std::to_string(step) + " (loss " +
                            std::to_string(loss_v) + "; lower local.learning_rate?)");
    }
    loss_sum += loss_v;
    autograd::backward(loss);
    if (options_.grad_clip > 0) optim::clip_grad_norm(params, options_.grad_clip);
    autograd::NoGradGuard no_grad;
    size_t offset = 0;
    const float lr = plan.learning_rate();
    const float mu = options_.prox_mu;
    for (const auto& p : params) {
      float* w = p.data<float>();
      const Tensor g = p.grad();
      const int64_t numel = p.numel();
      if (g.defined()) {
        const float* gd = g.data<float>();
        const float* w0 = global.data() + offset;
        for (int64_t i = 0; i < numel; ++i) {
          const float grad = mu > 0 ? gd[i] + mu * (w[i] - w0[i]) : gd[i];
          w[i] -= lr * grad;
        }
      }
      offset += static_cast<size_t>(numel);
    }
  }
  const auto local = flatten(model_);
  for (size_t i = 0; i < local.size(); ++i) delta[i] = local[i] - global[i];
  return TrainReport{static_cast<uint64_t>(n),
                     static_cast<float>(loss_sum / static_cast<double>(steps))};
}

}  // namespace starling::edge_client
