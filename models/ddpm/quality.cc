// The classifier check: train the 2NN, then softmax statistics on real and generated images.
#include "models/ddpm/quality.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/autograd/autograd.h"
#include "core/ops/ops.h"
#include "core/optim/optimizer.h"
#include "models/mlp/mlp.h"

namespace starling::models {

namespace {

// Mean max probability, per-image argmax and the fraction of max probabilities >= 0.9 of
// images (n, 784) in [0, 1].
struct Labels {
  double mean_max = 0.0;
  double confident = 0.0;
  std::vector<int32_t> argmax;
};

Labels label(const Mlp& model, const float* images, int64_t n) {
  autograd::NoGradGuard ng;
  Labels out;
  constexpr int64_t kBatch = 1000;
  for (int64_t at = 0; at < n; at += kBatch) {
    const int64_t b = std::min(kBatch, n - at);
    Tensor x = Tensor::uninitialized({b, 784});
    std::memcpy(x.data<float>(), images + at * 784, static_cast<size_t>(b * 784) * sizeof(float));
    const auto p = ops::softmax(model.forward(x)).to_float_vector();
    for (int64_t i = 0; i < b; ++i) {
      const float* row = p.data() + i * 10;
      const auto best = std::max_element(row, row + 10);
      out.mean_max += *best;
      out.confident += *best >= 0.9f ? 1.0 : 0.0;
      out.argmax.push_back(static_cast<int32_t>(best - row));
    }
  }
  out.mean_max /= static_cast<double>(std::max<int64_t>(n, 1));
  out.confident /= static_cast<double>(std::max<int64_t>(n, 1));
  return out;
}

}  // namespace

std::string SampleQuality::summary() const {
  std::string s = fmt::format(
      "classifier: 2NN (784-200-200-10) on the training split, {} epochs, test accuracy {:.4f}, "
      "mean max-probability on real test "
      "images {:.4f}\n",
      classifier_epochs, classifier_test_accuracy, real_mean_max_prob);
  int64_t n = 0;
  for (int64_t h : histogram) n += h;
  s += fmt::format(
      "samples: {} images, mean max-probability {:.4f}, {:.1f}% at >= 0.9, class histogram "
      "entropy {:.3f} bits (uniform: 3.322)\n",
      n, sample_mean_max_prob, 100.0 * sample_confident_fraction, histogram_entropy_bits);
  s += "class histogram:";
  for (size_t k = 0; k < histogram.size(); ++k) s += fmt::format(" {}:{}", k, histogram[k]);
  return s;
}

Result<SampleQuality> classify_samples(const Tensor& samples, const data::MnistSet& train,
                                       const data::MnistSet& test, int64_t epochs, uint64_t seed) {
  if (samples.dim() != 4 || samples.size(1) != 1 || samples.size(2) != 28 ||
      samples.size(3) != 28 || samples.size(0) < 1) {
    return invalid_argument("classifier check: samples must be (N, 1, 28, 28), got " +
                            shape_str(samples.shape()));
  }
  if (train.pixels() != 784 || test.pixels() != 784 || train.size() == 0 || test.size() == 0) {
    return invalid_argument("classifier check: needs non-empty 28x28 train and test sets");
  }
  Mlp model(MlpConfig{}, seed);
  optim::Sgd opt(optim::decay_matrices_only(model.parameters()),
                 optim::SgdOptions{0.9, 0.0, false});
  Rng rng(seed + 1);
  constexpr int64_t kBatch = 64;
  const int64_t n = train.size();
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  for (int64_t e = 0; e < epochs; ++e) {
    for (int64_t i = n - 1; i > 0; --i) {
      std::swap(order[static_cast<size_t>(i)], order[rng.below(static_cast<uint64_t>(i + 1))]);
    }
    const double lr = e + 1 == epochs && epochs > 1 ? 0.01 : 0.05;
    for (int64_t at = 0; at + kBatch <= n; at += kBatch) {
      Tensor x = Tensor::uninitialized({kBatch, 784});
      std::vector<int32_t> y(kBatch);
      for (int64_t i = 0; i < kBatch; ++i) {
        const int64_t k = order[static_cast<size_t>(at + i)];
        std::memcpy(x.data<float>() + i * 784, train.images.data() + k * 784, 784 * sizeof(float));
        y[static_cast<size_t>(i)] = train.labels[static_cast<size_t>(k)];
      }
      Tensor loss = ops::cross_entropy(model.forward(x), Tensor::from_vector(y, {kBatch}));
      autograd::backward(loss);
      opt.step(lr);
      opt.zero_grad();
    }
  }
  SampleQuality q;
  q.classifier_epochs = epochs;
  q.classifier_test_accuracy =
      evaluate(model, test.images.data(), test.labels.data(), test.size()).accuracy;
  q.real_mean_max_prob = label(model, test.images.data(), test.size()).mean_max;
  std::vector<float> img = samples.to_float_vector();
  for (float& v : img) v = std::clamp((v + 1.0f) * 0.5f, 0.0f, 1.0f);
  const Labels ls = label(model, img.data(), samples.size(0));
  q.sample_mean_max_prob = ls.mean_max;
  q.sample_confident_fraction = ls.confident;
  for (int32_t c : ls.argmax) ++q.histogram[static_cast<size_t>(c)];
  for (int64_t h : q.histogram) {
    if (h == 0) continue;
    const double p = static_cast<double>(h) / static_cast<double>(samples.size(0));
    q.histogram_entropy_bits -= p * std::log2(p);
  }
  return q;
}

}  // namespace starling::models
