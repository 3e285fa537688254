// The CNN forward pass.
#include "models/mlp/cnn.h"

#include <cmath>

#include "core/ops/elementwise.h"
#include "core/ops/pool.h"
#include "core/ops/relu.h"
#include "core/util/rng.h"

namespace starling::models {

Cnn::Cnn(const CnnConfig& config, uint64_t seed, const InitSpec& init) : config_(config) {
  Rng rng(seed);
  conv1_ = register_module("conv1",
                           std::make_shared<nn::Conv2d>(1, config.channels1, 5, 1, 2, true, rng));
  conv2_ = register_module("conv2", std::make_shared<nn::Conv2d>(config.channels1, config.channels2,
                                                                 5, 1, 2, true, rng));
  const int64_t flat = config.channels2 * (config.side / 4) * (config.side / 4);
  fc1_ = register_module("fc1", std::make_shared<nn::Linear>(flat, config.hidden, true, rng));
  fc2_ = register_module("fc2",
                         std::make_shared<nn::Linear>(config.hidden, config.classes, true, rng));
  // Conv2d draws PyTorch's init itself; the other schemes redraw the convolutions too.
  if (init.kind != ClassifierInit::kTorch) {
    for (auto* conv : {conv1_.get(), conv2_.get()}) {
      init_layer(conv->weight, conv->bias, init, rng);
    }
  }
  for (auto* fc : {fc1_.get(), fc2_.get()}) init_layer(fc->weight, fc->bias, init, rng);
}

Tensor Cnn::forward(const Tensor& x) const {
  const int64_t b = x.shape()[0];
  Tensor h = ops::reshape(x, {b, 1, config_.side, config_.side});
  h = ops::max_pool2d(ops::relu(conv1_->forward(h)), 2);
  h = ops::max_pool2d(ops::relu(conv2_->forward(h)), 2);
  h = ops::reshape(h, {b, -1});
  return fc2_->forward(ops::relu(fc1_->forward(h)));
}

}  // namespace starling::models
