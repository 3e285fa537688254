// The MNIST CNN of McMahan et al.: its parameter count, shapes, and that it learns.
#include "models/mlp/cnn.h"

#include <catch2/catch.hpp>

#include "core/autograd/autograd.h"
#include "core/ops/ops.h"
#include "core/optim/optimizer.h"

namespace starling::models {
namespace {

TEST_CASE("the CNN has the paper's 1,663,370 parameters and PyTorch names", "[models]") {
  Cnn cnn(CnnConfig{}, 1);
  CHECK(cnn.num_parameters() == 1'663'370);
  const auto named = cnn.named_parameters();
  REQUIRE(named.size() == 8);
  CHECK(named[0].first == "conv1.weight");
  CHECK(named[0].second.shape() == Shape{32, 1, 5, 5});
  CHECK(named[2].first == "conv2.weight");
  CHECK(named[4].first == "fc1.weight");
  CHECK(named[4].second.shape() == Shape{512, 3136});
  CHECK(named[7].first == "fc2.bias");
}

TEST_CASE("a small CNN overfits a batch of images", "[models]") {
  Cnn cnn(CnnConfig{8, 4, 8, 16, 3}, 3);
  Rng rng(5);
  const int64_t b = 6;
  Tensor x = Tensor::uniform({b, 64}, rng, 0.0, 1.0);
  Tensor y = Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 0, 1, 2}, {b});
  CHECK(cnn.forward(x).shape() == Shape{b, 3});
  optim::Sgd opt(optim::decay_matrices_only(cnn.parameters()), optim::SgdOptions{});
  double first = 0, last = 0;
  for (int step = 0; step < 300; ++step) {
    cnn.zero_grad();
    Tensor loss = ops::cross_entropy(cnn.forward(x), y);
    if (step == 0) first = loss.item();
    last = loss.item();
    autograd::backward(loss);
    opt.step(0.3);
  }
  CHECK(first > 0.9);
  CHECK(last < 0.05);
}

}  // namespace
}  // namespace starling::models
