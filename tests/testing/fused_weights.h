// Random weights for every tensor of a fused GPT trunk (models/gpt/fused_gpt.h's layout), so that
// no gradient in a parity test is trivially zero or one: N(0, std) for matrices and biases, and
// N(1, std) for the LayerNorm weights.
#pragma once

#include <cstdint>
#include <string>

#include "core/io/state_dict.h"
#include "core/util/rng.h"
#include "models/gpt/fused_gpt.h"

namespace starling::testing {

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

}  // namespace starling::testing
