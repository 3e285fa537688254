// Conv2d and GroupNorm modules: parameter names and shapes, PyTorch init bounds, forward.
#include "core/nn/conv.h"

#include <catch2/catch.hpp>
#include <cmath>

#include "core/ops/conv.h"
#include "core/ops/norm2d.h"

namespace starling::nn {
namespace {

TEST_CASE("Conv2d and GroupNorm: names, shapes, init and forward", "[nn]") {
  Rng rng(1);
  Conv2d conv(3, 8, 3, 2, 1, true, rng);
  const auto params = conv.named_parameters();
  REQUIRE(params.size() == 2);
  REQUIRE(params[0].first == "weight");
  REQUIRE(params[0].second.shape() == Shape{8, 3, 3, 3});
  REQUIRE(params[1].first == "bias");
  const double bound = 1.0 / std::sqrt(27.0);
  for (float v : conv.weight.to_float_vector()) REQUIRE(std::fabs(v) <= bound);
  const Tensor x = Tensor::randn({2, 3, 9, 9}, rng);
  const Tensor y = conv.forward(x);
  REQUIRE(y.shape() == Shape{2, 8, 5, 5});
  REQUIRE(max_abs_diff(y, ops::conv2d(x, conv.weight, conv.bias, 2, 1)) == 0.0);
  REQUIRE(Conv2d(3, 4, 1, 1, 0, false, rng).num_parameters() == 12);

  GroupNorm gn(4, 8);
  REQUIRE(gn.num_parameters() == 16);
  const Tensor z = gn.forward(y);
  REQUIRE(max_abs_diff(z, ops::group_norm(y, 4, gn.weight, gn.bias)) == 0.0);
}

}  // namespace
}  // namespace starling::nn
