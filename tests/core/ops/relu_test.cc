// ReLU: values, and the float64 gradient against central differences.
#include "core/ops/relu.h"

#include <catch2/catch.hpp>

#include "tests/testing/gradcheck.h"

namespace starling::ops {
namespace {

TEST_CASE("relu forward", "[ops]") {
  const Tensor x = Tensor::from_vector(std::vector<float>{-2, -0.0f, 0.5f, 3}, {2, 2});
  CHECK(relu(x).to_float_vector() == std::vector<float>{0, 0, 0.5f, 3});
}

TEST_CASE("relu gradient matches central differences", "[ops]") {
  const auto seed = GENERATE(1, 2, 3);
  // Values kept away from the kink at 0, where the derivative is undefined.
  Tensor x = testing::rand64({3, 7}, static_cast<uint64_t>(seed));
  double* p = x.data<double>();
  for (int64_t i = 0; i < x.numel(); ++i) p[i] += p[i] >= 0 ? 0.01 : -0.01;
  const auto r = testing::gradcheck([](const std::vector<Tensor>& in) { return relu(in[0]); }, {x});
  INFO(r.worst);
  CHECK(r.max_rel_error < 1e-6);
}

}  // namespace
}  // namespace starling::ops
