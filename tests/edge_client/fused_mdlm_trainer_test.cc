// The fused-engine MDLM client trainer (what [client] device "cuda" runs for model.arch MDLM) on
// the fused CPU backend: the federation's layout, the autograd MdlmTrainer's update with AdamW
// (plain and block diffusion, antithetic masks), fresh moments every round, a new batch size, and
// the refusals it names by key.
#include "edge_client/fused_mdlm_trainer.h"

#include <algorithm>
#include <catch2/catch.hpp>

#include "edge_client/model_params.h"
#include "models/mdlm/mdlm.h"
#include "tests/testing/client_rounds.h"

namespace starling::edge_client {
namespace {

using Catch::Contains;

MdlmTrainerOptions tiny_adamw() {
  MdlmTrainerOptions o;
  o.model.vocab_size = 6;
  o.model.block_size = 8;
  o.model.n_layer = 2;
  o.model.n_head = 2;
  o.model.n_embd = 16;
  o.steps.optimizer = LocalStepOptions::Optimizer::kAdamW;
  o.steps.grad_clip = 1.0f;
  o.steps.weight_decay = 0.1f;
  return o;
}

std::shared_ptr<const std::vector<int32_t>> text(int n) { return testing::random_tokens(n, 6, 5); }

// Both trainers over two rounds from the same globals: the same losses and updates.
void check_matches_autograd(const MdlmTrainerOptions& options) {
  const auto tokens = text(700);
  MdlmTrainer autograd(tokens, 30, 650, options);
  auto fused = FusedMdlmTrainer::create(tokens, 30, 650, options, FusedDevice{});
  INFO(fused.status().to_string());
  REQUIRE(fused.ok());
  CHECK((*fused)->where() == "fused CPU engine");
  const auto& la = autograd.layout();
  const auto& lf = (*fused)->layout();
  REQUIRE(la.size() == lf.size());
  for (size_t i = 0; i < la.size(); ++i) {
    CHECK(la[i].name == lf[i].name);
    CHECK(la[i].shape == lf[i].shape);
    CHECK(la[i].offset == lf[i].offset);
  }
  // Forward and backward agree to ~1e-6 (tests/models/fused_mdlm_test.cc); the round's AdamW
  // steps from fresh moments amplify that, as for the GPT trainer (5e-6 to 3.8e-5 measured).
  const std::vector<float> g = flatten(models::Mdlm(options.model, 9));
  testing::check_same_rounds(autograd, **fused, g,
                             {testing::round_plan(31, 6, 4), testing::round_plan(32, 4, 3)}, 1e-5,
                             5e-4);
  std::vector<float> d1(g.size()), d2(g.size());
  REQUIRE((*fused)->train(g, testing::round_plan(33, 3, 4), d1).ok());
  REQUIRE((*fused)->train(g, testing::round_plan(33, 3, 4), d2).ok());
  CHECK(d1 == d2);
}

}  // namespace

TEST_CASE("fused MDLM trainer: the federation's layout and the autograd trainer's update",
          "[fed]") {
  check_matches_autograd(tiny_adamw());
}

TEST_CASE("fused MDLM trainer: block diffusion and antithetic masks match the autograd trainer",
          "[fed]") {
  auto o = tiny_adamw();
  o.model.block_length = 4;
  check_matches_autograd(o);
  o = tiny_adamw();
  o.model.antithetic = true;
  o.model.masking = models::MaskSampling::kCount;
  check_matches_autograd(o);
}

TEST_CASE("fused MDLM trainer: what the engine cannot run is refused by key", "[fed]") {
  const auto tokens = text(200);
  auto sgd = tiny_adamw();
  sgd.steps.optimizer = LocalStepOptions::Optimizer::kSgd;
  auto r = FusedMdlmTrainer::create(tokens, 0, 200, sgd, FusedDevice{});
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Contains("model.local_optimizer"));
  auto prox = tiny_adamw();
  prox.steps.prox_mu = 0.01f;
  r = FusedMdlmTrainer::create(tokens, 0, 200, prox, FusedDevice{});
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Contains("local.prox_mu"));
  auto uniform = tiny_adamw();
  uniform.model.noise = models::DiffusionNoise::kUniform;
  r = FusedMdlmTrainer::create(tokens, 0, 200, uniform, FusedDevice{});
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Contains("noise"));
  r = FusedMdlmTrainer::create(tokens, 0, 200, tiny_adamw(), FusedDevice{false, {}, 2});
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Contains("client.gpus"));
  r = FusedMdlmTrainer::create(tokens, 0, 200, tiny_adamw(), FusedDevice{true, {97}});
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Contains("cuda") || Contains("CUDA"));
}

}  // namespace starling::edge_client
