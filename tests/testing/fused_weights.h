// Helpers of the fused engine's parity tests: random weights for every tensor of a fused GPT trunk
// (models/gpt/fused_gpt.h's layout), and the comparison of its gradient buffer with an autograd
// model's gradients.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/io/state_dict.h"
#include "core/util/rng.h"
#include "models/gpt/fused_gpt.h"
#include "tests/testing/normalized_error.h"

namespace starling::testing {

// N(0, std) for matrices and biases and N(1, std) for the LayerNorm weights, so that no gradient
// is trivially zero or one.
inline io::StateDict random_fused_weights(const models::GptConfig& c, uint64_t seed,
                                          double std = 0.2) {
  Rng rng(seed);
  io::StateDict sd;
  for (const auto& p : models::fused_gpt_layout(c)) {
    const bool ln_weight = p.name.find("ln_") != std::string::npos && p.name.size() > 7 &&
                           p.name.substr(p.name.size() - 7) == ".weight";
    sd.emplace_back(p.name, Tensor::randn(p.shape, rng, std, ln_weight ? 1.0 : 0.0));
  }
  return sd;
}

// Every tensor of the fused gradient buffer `grads` (laid out as `layout`) against the gradient
// of the autograd parameter of the same name and order in `named` (Module::named_parameters()):
// names, sizes, and normalized_error <= tol.
template <typename Named>
void check_fused_gradients(const std::vector<models::FusedParam>& layout,
                           const std::vector<float>& grads, const Named& named, double tol) {
  REQUIRE(named.size() == layout.size());
  for (size_t i = 0; i < named.size(); ++i) {
    const auto& p = layout[i];
    INFO(p.name);
    REQUIRE(named[i].first == p.name);
    const Tensor g = named[i].second.grad();
    REQUIRE(g.defined());
    REQUIRE(static_cast<size_t>(g.numel()) == p.numel);
    CHECK(normalized_error(grads.data() + p.offset, g.data<float>(), p.numel) <= tol);
  }
}

}  // namespace starling::testing
