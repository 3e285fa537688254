// The char GPT local trainer: deterministic rounds, loss that falls, step counts, bad input.
#include "edge_client/gpt_trainer.h"

#include <catch2/catch.hpp>

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
