// The CNN forward pass.
#include "models/mlp/cnn.h"

#include <cmath>

#include "core/ops/elementwise.h"
#include "core/ops/pool.h"
#include "core/ops/relu.h"
#include "core/util/rng.h"

namespace starling::models {

Cnn::Cnn(const CnnConfig& config, uint64_t seed) : config_(config) {
  Rng rng(seed);
  conv1_ = register_module("conv1",
                           std::make_shared<nn::Conv2d>(1, config.channels1, 5, 1, 2, true, rng));
  conv2_ = register_module("conv2", std::make_shared<nn::Conv2d>(config.channels1, config.channels2,
                                                                 5, 1, 2, true, rng));
  const int64_t flat = config.channels2 * (config.side / 4) * (config.side / 4);
  fc1_ = register_module("fc1", std::make_shared<nn::Linear>(flat, config.hidden, true, rng));
  fc2_ = register_module("fc2",
                         std::make_shared<nn::Linear>(config.hidden, config.classes, true, rng));
  for (auto* fc : {fc1_.get(), fc2_.get()}) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(fc->weight.shape()[1]));
    fc->weight.copy_from(Tensor::uniform(fc->weight.shape(), rng, -bound, bound));
    fc->bias.copy_from(Tensor::uniform(fc->bias.shape(), rng, -bound, bound));
  }
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
