// The char GPT local trainer: deterministic rounds, loss that falls, step counts, bad input.
#include "edge_client/gpt_trainer.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>

#include "edge_client/model_params.h"

namespace starling::edge_client {
namespace {

GptTrainerOptions tiny() {
  GptTrainerOptions o;
  o.model.vocab_size = 5;
  o.model.block_size = 8;
  o.model.n_layer = 1;
  o.model.n_head = 2;
  o.model.n_embd = 16;
  o.grad_clip = 1.0f;
  return o;
}

// A periodic stream 0 1 2 3 4 0 1 2 ...: next-token prediction can learn it exactly.
std::shared_ptr<const std::vector<int32_t>> stream(int n) {
  auto v = std::make_shared<std::vector<int32_t>>();
  for (int i = 0; i < n; ++i) v->push_back(i % 5);
  return v;
}

v1::RoundPlan plan(uint64_t seed, uint32_t steps) {
  v1::RoundPlan p;
  p.set_round(1);
  p.set_local_steps(steps);
  p.set_batch_size(4);
  p.set_learning_rate(0.3f);
  p.set_seed(seed);
  return p;
}

TEST_CASE("a GPT client round repeats bit for bit and moves the model", "[edge_client]") {
  auto tokens = stream(300);
  GptTrainer a(tokens, 10, 200, tiny());
  GptTrainer b(tokens, 10, 200, tiny());
  const auto global = flatten(models::Gpt(tiny().model, 7));
  REQUIRE(global.size() == static_cast<size_t>(*compress::validate_layout(a.layout())));
  std::vector<float> da(global.size()), db(global.size());
  auto ra = a.train(global, plan(3, 4), da);
  auto rb = b.train(global, plan(3, 4), db);
  REQUIRE(ra.ok());
  REQUIRE(rb.ok());
  CHECK(ra->num_samples == 190);
  CHECK(ra->loss == rb->loss);
  CHECK(da == db);
  double norm = 0;
  for (float v : da) norm += static_cast<double>(v) * v;
  CHECK(norm > 0);
  std::vector<float> dc(global.size());
  REQUIRE(a.train(global, plan(4, 4), dc).ok());
  CHECK(dc != da);  // another seed, other windows
}

TEST_CASE("federated rounds of the GPT trainer lower its loss", "[edge_client]") {
  auto tokens = stream(400);
  GptTrainer t(tokens, 0, 400, tiny());
  auto global = flatten(models::Gpt(tiny().model, 1));
  std::vector<float> delta(global.size());
  float first = 0, last = 0;
  for (uint64_t round = 1; round <= 8; ++round) {
    auto r = t.train(global, plan(round, 5), delta);
    REQUIRE(r.ok());
    if (round == 1) first = r->loss;
    last = r->loss;
    for (size_t i = 0; i < global.size(); ++i) global[i] += delta[i];
  }
  CHECK(last < 0.5f * first);
}

TEST_CASE("GPT local steps and bad input", "[edge_client]") {
  v1::RoundPlan p = plan(1, 0);
  CHECK(gpt_local_steps(81, 8, 1, p) == 3);  // 10 windows of 8, batch 4
  CHECK(gpt_local_steps(81, 8, 2, p) == 6);
  CHECK(gpt_local_steps(5, 8, 1, p) == 1);  // at least one step
  p.set_local_steps(7);
  CHECK(gpt_local_steps(81, 8, 1, p) == 7);

  auto tokens = stream(100);
  const auto global = flatten(models::Gpt(tiny().model, 1));
  std::vector<float> delta(global.size());
  GptTrainer short_client(tokens, 0, 8, tiny());  // 8 tokens: no window of 8 plus a target
  auto r = short_client.train(global, plan(1, 1), delta);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kFailedPrecondition);
  GptTrainer ok(tokens, 0, 100, tiny());
  std::vector<float> wrong(global.size() - 1);
  CHECK_FALSE(ok.train(wrong, plan(1, 1), delta).ok());
  v1::RoundPlan zero = plan(1, 1);
  zero.set_batch_size(0);
  CHECK_FALSE(ok.train(global, zero, delta).ok());
}

}  // namespace
}  // namespace starling::edge_client

namespace starling::edge_client {
namespace {

TEST_CASE("a GPT client round with local AdamW: fresh moments, lower loss than SGD's",
          "[edge_client]") {
  auto tokens = stream(300);
  GptTrainerOptions adam = tiny();
  adam.optimizer = LocalStepOptions::Optimizer::kAdamW;
  GptTrainer a(tokens, 10, 200, adam);
  GptTrainer s(tokens, 10, 200, tiny());
  const auto global = flatten(models::Gpt(tiny().model, 7));
  v1::RoundPlan p = plan(3, 30);
  std::vector<float> da(global.size()), da2(global.size()), ds(global.size());
  auto ra = a.train(global, p, da);
  REQUIRE(ra.ok());
  // No state survives the round: the same round again gives the same update bit for bit.
  auto ra2 = a.train(global, p, da2);
  REQUIRE(ra2.ok());
  CHECK(da == da2);
  // AdamW steps are about lr per coordinate whatever the gradient's scale: SGD's are not.
  p.set_learning_rate(0.01f);
  REQUIRE(a.train(global, p, da).ok());
  double max_step = 0;
  for (float v : da) max_step = std::max(max_step, static_cast<double>(std::abs(v)));
  CHECK(max_step <= 30 * 0.01 * 2);
  CHECK(max_step > 0.01);
  // On this learnable stream AdamW at 0.01 ends the round below SGD at 0.3.
  auto after = [&](GptTrainer& t, float lr) {
    v1::RoundPlan q = plan(3, 30);
    q.set_learning_rate(lr);
    std::vector<float> d(global.size());
    REQUIRE(t.train(global, q, d).ok());
    std::vector<float> w(global);
    for (size_t i = 0; i < w.size(); ++i) w[i] += d[i];
    std::vector<float> zero(global.size());
    // A one-step round at learning rate 0 only measures the loss of w.
    v1::RoundPlan m = plan(9, 1);
    m.set_learning_rate(0.0f);
    auto r = t.train(w, m, zero);
    REQUIRE(r.ok());
    return r->loss;
  };
  CHECK(after(a, 0.01f) < after(s, 0.3f));
}

}  // namespace
}  // namespace starling::edge_client
