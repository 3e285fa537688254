// Module parameter registry and state dicts.
#include "core/nn/module.h"

#include <catch2/catch.hpp>

#include "core/nn/transformer.h"

using starling::Tensor;

TEST_CASE("block parameters, state dict aliasing and strict loading", "[nn]") {
  starling::Rng init(1), drop(2);
  starling::nn::TransformerShape s{8, 2, 1, 0.0, true, true};
  starling::nn::Block block(s, init, drop);
  auto named = block.named_parameters();
  REQUIRE(named.size() == 12);  // 2 LN x 2 + 4 Linear x 2
  REQUIRE(named[0].first == "ln_1.weight");
  REQUIRE(named[2].first == "attn.c_attn.weight");
  REQUIRE(named[2].second.shape() == starling::Shape{24, 8});
  for (auto& [n, t] : named) REQUIRE(t.requires_grad());

  // The state dict aliases the parameters; loading copies values in.
  auto sd = block.state_dict();
  REQUIRE(sd[2].second.shares_storage(named[2].second));
  starling::Rng init2(9), drop2(9);
  starling::nn::Block other(s, init2, drop2);
  starling::io::StateDict copy;
  for (auto& [n, t] : sd) copy.emplace_back(n, t.clone());
  REQUIRE(other.load_state_dict(copy).ok());
  REQUIRE(starling::max_abs_diff(other.named_parameters()[2].second, named[2].second) == 0.0);
  copy.pop_back();
  REQUIRE_FALSE(other.load_state_dict(copy).ok());
  REQUIRE(other.load_state_dict(copy, /*strict=*/false).ok());
}
