// The image classifiers of the classic federated baselines (McMahan et al. 2017): the MNIST
// "2NN", a multilayer perceptron in -> hidden -> hidden -> classes with ReLU, and the CNN
// (models/mlp/cnn.h), with PyTorch layouts and names, and their evaluation.
#pragma once

#include <cstdint>
#include <memory>

#include "core/nn/layers.h"
#include "core/nn/module.h"
#include "core/util/rng.h"

namespace starling::models {

// How a classifier's weights are drawn. The papers these models come from do not say; the
// framework of the day decided:
// - kTorch: PyTorch's nn.Linear / nn.Conv2d, weights and biases U(+-1/sqrt(fan_in)).
// - kGlorot: Keras' and TensorFlow 2's default, weights U(+-sqrt(6 / (fan_in + fan_out))),
//   biases 0.
// - kTruncatedNormal: the TensorFlow 1 MNIST tutorials' weight_variable / bias_variable,
//   weights N(0, std^2) redrawn outside +-2 std, biases the constant `bias`.
enum class ClassifierInit { kTorch, kGlorot, kTruncatedNormal };

struct InitSpec {
  ClassifierInit kind = ClassifierInit::kTorch;
  double std = 0.1;   // kTruncatedNormal
  double bias = 0.1;  // kTruncatedNormal
};

// Draws `weight` (out, fan_in...) and `bias` (out; may be undefined) as `spec` says, fan_in and
// fan_out counting the kernel's receptive field for convolutions.
void init_layer(Tensor& weight, Tensor& bias, const InitSpec& spec, Rng& rng);

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
  // Weights from Rng(seed) as `init` says (default: as torch.nn.Linear).
  Mlp(const MlpConfig& config, uint64_t seed, const InitSpec& init = {});
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
