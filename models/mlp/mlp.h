// The image classifiers of the classic federated baselines (McMahan et al. 2017): the MNIST
// "2NN", a multilayer perceptron in -> hidden -> hidden -> classes with ReLU, and the CNN
// (models/mlp/cnn.h), with PyTorch layouts and names, and their evaluation.
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

// A classifier of flattened images: (B, pixels) f32 -> logits (B, classes).
class Classifier : public nn::Module {
 public:
  virtual Tensor forward(const Tensor& x) const = 0;
  virtual int64_t in_features() const = 0;
  virtual int64_t classes() const = 0;
};

class Mlp : public Classifier {
 public:
  // Initialized as torch.nn.Linear: weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  Mlp(const MlpConfig& config, uint64_t seed);
  // x: (B, in) f32 -> logits (B, classes).
  Tensor forward(const Tensor& x) const override;
  int64_t in_features() const override { return config_.in; }
  int64_t classes() const override { return config_.classes; }
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
EvalResult evaluate(const Classifier& model, const float* images, const int32_t* labels, int64_t n,
                    int64_t batch = 1000);

}  // namespace starling::models
