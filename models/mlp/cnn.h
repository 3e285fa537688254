// The CNN of McMahan et al. 2017 for MNIST: two 5x5 convolutions (32 and 64 channels, "same"
// padding), each followed by ReLU and 2x2 max pooling, a fully connected layer of 512 with
// ReLU, and the 10-way output: 1,663,370 parameters at the paper's sizes. Names follow a
// PyTorch module with conv1, conv2, fc1, fc2.
#pragma once

#include <cstdint>
#include <memory>

#include "core/nn/conv.h"
#include "core/nn/layers.h"
#include "models/mlp/mlp.h"

namespace starling::models {

struct CnnConfig {
  int64_t side = 28;  // square images side x side, one channel
  int64_t channels1 = 32;
  int64_t channels2 = 64;
  int64_t hidden = 512;
  int64_t classes = 10;
};

class Cnn : public Classifier {
 public:
  // Weights from Rng(seed) as `init` says (default: as PyTorch's Conv2d and Linear).
  // REQUIRES: side divisible by 4.
  Cnn(const CnnConfig& config, uint64_t seed, const InitSpec& init = {});
  Tensor forward(const Tensor& x) const override;
  int64_t in_features() const override { return config_.side * config_.side; }
  int64_t classes() const override { return config_.classes; }
  const CnnConfig& config() const { return config_; }

 private:
  CnnConfig config_;
  std::shared_ptr<nn::Conv2d> conv1_, conv2_;
  std::shared_ptr<nn::Linear> fc1_, fc2_;
};

}  // namespace starling::models
