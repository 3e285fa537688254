// A quantitative check of generated digits: an MNIST classifier (the 2NN of models/mlp) trained
// on the real training set labels the samples; confident labels spread over all classes mean
// the samples look like digits of every kind.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/data/mnist.h"
#include "core/tensor/tensor.h"
#include "core/util/status.h"

namespace starling::models {

struct SampleQuality {
  int64_t classifier_epochs = 0;
  double classifier_test_accuracy = 0.0;   // on the real test split
  double real_mean_max_prob = 0.0;         // mean max softmax probability on real test images
  double sample_mean_max_prob = 0.0;       // the same on the samples
  double sample_confident_fraction = 0.0;  // samples with max probability >= 0.9
  std::array<int64_t, 10> histogram{};     // samples per predicted class
  double histogram_entropy_bits = 0.0;     // log2(10) = 3.32 for a uniform histogram
  std::string summary() const;             // several lines, for logs and the CLI
};

// Trains the 2NN (784-200-200-10, SGD with momentum, `epochs` epochs, Rng(seed)) on `train`,
// evaluates it on `test`, and labels `samples` (N, 1, 28, 28) f32 in [-1, 1].
// InvalidArgument when the images are not 28x28 gray or the sets are empty.
Result<SampleQuality> classify_samples(const Tensor& samples, const data::MnistSet& train,
                                       const data::MnistSet& test, int64_t epochs = 2,
                                       uint64_t seed = 1);

}  // namespace starling::models
