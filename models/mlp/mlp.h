// The MNIST "2NN" of McMahan et al. 2017: a multilayer perceptron in -> hidden -> hidden ->
// classes with ReLU, PyTorch layouts and names (fc1, fc2, fc3), and its evaluation.
#pragma once

#include <cstdint>
#include <memory>

#include "core/nn/layers.h"
#include "core/nn/module.h"

namespace starling::models {

struct MlpConfig {
  int64_t in = 784;
  int64_t hidden = 200;
  int64_t classes = 10;
};

class Mlp : public nn::Module {
 public:
  // Initialized as torch.nn.Linear: weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  Mlp(const MlpConfig& config, uint64_t seed);
  // x: (B, in) f32 -> logits (B, classes).
  Tensor forward(const Tensor& x) const;
  const MlpConfig& config() const { return config_; }

 private:
  MlpConfig config_;
  std::shared_ptr<nn::Linear> fc1_, fc2_, fc3_;
};

struct EvalResult {
  double loss = 0.0;      // mean cross-entropy
  double accuracy = 0.0;  // fraction of argmax == label
  int64_t examples = 0;
};

// Evaluates `model` on n examples: images (n, in) row-major f32, labels (n), in batches.
EvalResult evaluate(const Mlp& model, const float* images, const int32_t* labels, int64_t n,
                    int64_t batch = 1000);

}  // namespace starling::models
