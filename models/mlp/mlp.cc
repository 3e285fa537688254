// The 2NN forward pass and evaluation.
#include "models/mlp/mlp.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/ops/ops.h"
#include "core/ops/relu.h"
#include "core/util/rng.h"

namespace starling::models {
void init_layer(Tensor& weight, Tensor& bias, const InitSpec& spec, Rng& rng) {
  const Shape& shape = weight.shape();
  int64_t receptive = 1;
  for (size_t d = 2; d < shape.size(); ++d) receptive *= shape[d];
  const int64_t fan_in = shape[1] * receptive, fan_out = shape[0] * receptive;
  switch (spec.kind) {
    case ClassifierInit::kTorch: {
      const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
      weight.copy_from(Tensor::uniform(shape, rng, -bound, bound));
      if (bias.defined()) bias.copy_from(Tensor::uniform(bias.shape(), rng, -bound, bound));
      return;
    }
    case ClassifierInit::kGlorot: {
      const double bound = std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
      weight.copy_from(Tensor::uniform(shape, rng, -bound, bound));
      if (bias.defined()) bias.copy_from(Tensor::zeros(bias.shape()));
      return;
    }
    case ClassifierInit::kTruncatedNormal: {
      Tensor w = Tensor::uninitialized(shape);
      float* pw = w.data<float>();
      const int64_t n = w.numel();
      for (int64_t i = 0; i < n; ++i) {
        double z = rng.normal();
        while (std::fabs(z) > 2.0) z = rng.normal();
        pw[i] = static_cast<float>(spec.std * z);
      }
      weight.copy_from(w);
      if (bias.defined()) bias.copy_from(Tensor::full(bias.shape(), spec.bias));
      return;
    }
  }
}

Mlp::Mlp(const MlpConfig& config, uint64_t seed, const InitSpec& init) : config_(config) {
  Rng rng(seed);
  fc1_ = register_module("fc1", std::make_shared<nn::Linear>(config.in, config.hidden, true, rng));
  fc2_ =
      register_module("fc2", std::make_shared<nn::Linear>(config.hidden, config.hidden, true, rng));
  fc3_ = register_module("fc3",
                         std::make_shared<nn::Linear>(config.hidden, config.classes, true, rng));
  for (auto* fc : {fc1_.get(), fc2_.get(), fc3_.get()}) init_layer(fc->weight, fc->bias, init, rng);
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
