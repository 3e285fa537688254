// The 2NN forward pass and evaluation.
#include "models/mlp/mlp.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/ops/ops.h"
#include "core/ops/relu.h"
#include "core/util/rng.h"

namespace starling::models {
namespace {

void torch_init(nn::Linear& layer, int64_t fan_in, Rng& rng) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  layer.weight.copy_from(Tensor::uniform(layer.weight.shape(), rng, -bound, bound));
  layer.bias.copy_from(Tensor::uniform(layer.bias.shape(), rng, -bound, bound));
}

}  // namespace

Mlp::Mlp(const MlpConfig& config, uint64_t seed) : config_(config) {
  Rng rng(seed);
  fc1_ = register_module("fc1", std::make_shared<nn::Linear>(config.in, config.hidden, true, rng));
  fc2_ =
      register_module("fc2", std::make_shared<nn::Linear>(config.hidden, config.hidden, true, rng));
  fc3_ = register_module("fc3",
                         std::make_shared<nn::Linear>(config.hidden, config.classes, true, rng));
  torch_init(*fc1_, config.in, rng);
  torch_init(*fc2_, config.hidden, rng);
  torch_init(*fc3_, config.hidden, rng);
}

Tensor Mlp::forward(const Tensor& x) const {
  Tensor h = ops::relu(fc1_->forward(x));
  h = ops::relu(fc2_->forward(h));
  return fc3_->forward(h);
}

EvalResult evaluate(const Classifier& model, const float* images, const int32_t* labels, int64_t n,
                    int64_t batch) {
  autograd::NoGradGuard no_grad;
  EvalResult r;
  const int64_t in = model.in_features();
  const int64_t classes = model.classes();
  double loss_sum = 0.0;
  int64_t correct = 0;
  for (int64_t at = 0; at < n; at += batch) {
    const int64_t b = std::min(batch, n - at);
    Tensor x = Tensor::uninitialized({b, in});
    std::memcpy(x.data<float>(), images + at * in, static_cast<size_t>(b * in) * sizeof(float));
    Tensor y = Tensor::from_vector(std::vector<int32_t>(labels + at, labels + at + b), {b});
    const Tensor logits = model.forward(x);
    loss_sum += ops::cross_entropy(logits, y).item() * static_cast<double>(b);
    const float* l = logits.data<float>();
    for (int64_t i = 0; i < b; ++i) {
      const float* row = l + i * classes;
      const auto best = std::max_element(row, row + classes) - row;
      if (best == labels[at + i]) ++correct;
    }
  }
  r.examples = n;
  if (n > 0) {
    r.loss = loss_sum / static_cast<double>(n);
    r.accuracy = static_cast<double>(correct) / static_cast<double>(n);
  }
  return r;
}

}  // namespace starling::models
