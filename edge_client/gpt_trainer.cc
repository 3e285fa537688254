// Local SGD of a char GPT on one client's text.
#include "edge_client/gpt_trainer.h"

#include <algorithm>

#include "core/util/rng.h"
#include "edge_client/local_steps.h"
#include "edge_client/model_params.h"

namespace starling::edge_client {

int64_t gpt_local_steps(int64_t num_tokens, int64_t block_size, uint32_t epochs,
                        const v1::RoundPlan& plan) {
  if (plan.local_steps() > 0) return plan.local_steps();
  const int64_t windows = std::max<int64_t>(1, (num_tokens - 1) / block_size);
  const int64_t batch = std::max<int64_t>(1, plan.batch_size());
  return static_cast<int64_t>(epochs) * ((windows + batch - 1) / batch);
}

Status check_text_round(int64_t begin, int64_t end, size_t size, int64_t block_size,
                        const v1::RoundPlan& plan) {
  const int64_t n = end - begin;
  if (begin < 0 || end > static_cast<int64_t>(size) || n <= block_size) {
    return failed_precondition("this client has " + std::to_string(n) +
                               " tokens, fewer than one window of " +
                               std::to_string(block_size + 1));
  }
  if (plan.batch_size() == 0) return invalid_argument("round plan with batch size 0");
  return ok_status();
}

void draw_windows(Rng& rng, const int32_t* tokens, int64_t n, int64_t B, int64_t T,
                  std::vector<int32_t>& x, std::vector<int32_t>* y) {
  x.resize(static_cast<size_t>(B * T));
  if (y) y->resize(x.size());
  for (int64_t b = 0; b < B; ++b) {
    const auto start = static_cast<int64_t>(rng.below(static_cast<uint64_t>(n - T)));
    std::copy(tokens + start, tokens + start + T, x.begin() + b * T);
    if (y) std::copy(tokens + start + 1, tokens + start + T + 1, y->begin() + b * T);
  }
}

GptTrainer::GptTrainer(std::shared_ptr<const std::vector<int32_t>> tokens, int64_t begin,
                       int64_t end, GptTrainerOptions options)
    : tokens_(std::move(tokens)), begin_(begin), end_(end), options_(std::move(options)) {
  auto m = models::make_gpt(options_.model, 0, options_.base.get(), options_.lora);
  if (!m.ok()) {
    init_ = m.status();
    return;
  }
  model_ = std::move(*m);
  layout_ = layout_of(*model_);
}

Result<TrainReport> GptTrainer::train(std::span<const float> global, const v1::RoundPlan& plan,
                                      std::span<float> delta) {
  RETURN_IF_ERROR(init_);
  const int64_t T = options_.window();
  const int64_t n = end_ - begin_;
  RETURN_IF_ERROR(check_text_round(begin_, end_, tokens_->size(), T, plan));
  if (delta.size() != global.size()) return invalid_argument("delta and global sizes differ");
  const int64_t B = plan.batch_size();
  const int32_t* tok = tokens_->data() + begin_;
  std::vector<int32_t> x, y;
  LocalStepOptions steps_options;  // SGD (FedProx's term when prox_mu > 0) or AdamW
  steps_options.optimizer = options_.optimizer;
  steps_options.prox_mu = options_.prox_mu;
  steps_options.grad_clip = options_.grad_clip;
  steps_options.beta1 = options_.beta1;
  steps_options.beta2 = options_.beta2;
  steps_options.weight_decay = options_.weight_decay;
  ASSIGN_OR_RETURN(
      const float loss,
      run_local_steps(
          *model_, global, plan, gpt_local_steps(n, T, options_.epochs, plan), steps_options,
          [&](int64_t, Rng& rng) {
            draw_windows(rng, tok, n, B, T, x, &y);
            return model_->loss(Tensor::from_vector(x, {B, T}), Tensor::from_vector(y, {B, T}));
          },
          delta));
  return TrainReport{static_cast<uint64_t>(n), loss};
}

}  // namespace starling::edge_client
