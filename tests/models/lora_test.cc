// LoRA: float64 gradient checks of an adapted Linear, a zero B that leaves the base's logits
// unchanged, the merge that gives the adapted model's logits, the frozen base (no gradient, shared
// storage) and [lora] validation.
#include "models/gpt/lora.h"

#include <catch2/catch.hpp>
#include <cmath>

#include "core/autograd/autograd.h"
#include "core/nn/layers.h"
#include "core/ops/ops.h"
#include "tests/testing/gradcheck.h"

using starling::DType;
using starling::max_abs_diff;
using starling::Rng;
using starling::Tensor;
namespace models = starling::models;
namespace nn = starling::nn;
namespace ops = starling::ops;

namespace {

models::GptConfig tiny() {
  models::GptConfig c;
  c.vocab_size = 13;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.bias = true;
  c.gelu_tanh = true;
  return c;
}

models::LoraSpec spec(int64_t rank, std::vector<std::string> targets = {}) {
  models::LoraSpec s;
  s.rank = rank;
  s.alpha = 2.0 * static_cast<double>(rank);
  s.targets = targets.empty() ? models::lora_target_names() : targets;
  return s;
}

// Turns a parameter into float64 in place (the module keeps pointing at the same tensor).
void to_f64(Tensor& t) {
  const bool rg = t.requires_grad();
  *t.impl() = *t.to(DType::kF64).contiguous().impl();
  t.set_requires_grad(rg);
}

Tensor ids(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(b * t));
  for (auto& x : v) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
  return Tensor::from_vector(v, {b, t});
}

// Every adapter's B drawn at random, so the adapters change the output.
void randomize_b(models::Gpt& m, uint64_t seed) {
  Rng rng(seed);
  for (auto& [name, t] : m.named_trainable_parameters()) {
    if (name.find("lora_B") == std::string::npos) continue;
    t.copy_from(Tensor::randn(t.shape(), rng, 0.05));
  }
}

}  // namespace

TEST_CASE("an adapted Linear passes float64 gradient checks in A, B, x and the weight",
          "[models][lora]") {
  Rng init(3), drop(4);
  nn::Linear lin(6, 5, true, init);
  lin.add_lora(3, 6.0, 0.0, init, drop);
  to_f64(lin.weight);
  to_f64(lin.bias);
  to_f64(lin.lora_a);
  to_f64(lin.lora_b);
  Rng r(5);
  lin.lora_b.copy_from(Tensor::randn({5, 3}, r, 0.5, 0.0, DType::kF64));
  REQUIRE(lin.lora_scale == 2.0);
  const Tensor x = Tensor::randn({2, 4, 6}, r, 1.0, 0.0, DType::kF64);
  auto f = [&](const std::vector<Tensor>& in) { return lin.forward(in[0]); };
  // The inputs alias the layer's parameters, so the checker perturbs the layer itself.
  const auto res =
      starling::testing::gradcheck(f, {x, lin.lora_a, lin.lora_b, lin.weight, lin.bias});
  INFO(res.worst);
  REQUIRE(res.max_rel_error < 1e-6);
}

TEST_CASE("a frozen base gets no gradient and the adapters are the only trainable tensors",
          "[models][lora]") {
  models::Gpt base(tiny(), 1);
  auto m = models::make_gpt(tiny(), 9, &base, spec(2, {"attn.c_attn", "mlp.c_fc"}));
  REQUIRE(m.ok());
  models::Gpt& g = **m;
  const auto trainable = g.named_trainable_parameters();
  // Two targets per block, two blocks, A and B each.
  REQUIRE(trainable.size() == 8);
  for (const auto& [name, t] : trainable) {
    INFO(name);
    REQUIRE((name.find(".lora_A.weight") != std::string::npos ||
             name.find(".lora_B.weight") != std::string::npos));
  }
  REQUIRE(trainable[0].first == "transformer.h.0.attn.c_attn.lora_A.weight");
  const int64_t C = 16, r = 2;
  REQUIRE(g.num_trainable_parameters() == 2 * (r * (C + 3 * C) + r * (C + 4 * C)));
  // The frozen weights share the base's storage: no copy of the base per model.
  REQUIRE(g.transformer->wte->weight.shares_storage(base.transformer->wte->weight));
  REQUIRE(g.transformer->h->blocks()[1]->mlp->c_proj->weight.shares_storage(
      base.transformer->h->blocks()[1]->mlp->c_proj->weight));
  randomize_b(g, 2);
  Tensor loss = g.loss(ids(2, 8, 13, 3), ids(2, 8, 13, 4));
  starling::autograd::backward(loss);
  for (const auto& [name, t] : g.named_parameters()) {
    INFO(name);
    REQUIRE(t.grad().defined() == t.requires_grad());
  }
  for (const auto& [name, t] : base.named_parameters()) REQUIRE_FALSE(t.grad().defined());
}

TEST_CASE("zero-initialized B leaves the base's logits unchanged, bit for bit", "[models][lora]") {
  models::Gpt base(tiny(), 1);
  auto m = models::make_gpt(tiny(), 5, &base, spec(4));
  REQUIRE(m.ok());
  const Tensor x = ids(3, 8, 13, 7);
  starling::autograd::NoGradGuard ng;
  const auto a = base.forward(x).to_float_vector();
  const auto b = (*m)->forward(x).to_float_vector();
  REQUIRE(a == b);
  // A is drawn, B is zero.
  const auto& c_attn = (*m)->transformer->h->blocks()[0]->attn->c_attn;
  REQUIRE(c_attn->lora_a.to_double_vector() != std::vector<double>(c_attn->lora_a.numel(), 0.0));
  REQUIRE(c_attn->lora_b.to_double_vector() == std::vector<double>(c_attn->lora_b.numel(), 0.0));
}

TEST_CASE("merged weights give the adapted model's logits in a plain GPT", "[models][lora]") {
  models::Gpt base(tiny(), 1);
  auto m = models::make_gpt(tiny(), 5, &base, spec(4));
  REQUIRE(m.ok());
  randomize_b(**m, 11);
  const Tensor x = ids(2, 8, 13, 8);
  starling::autograd::NoGradGuard ng;
  (*m)->train(false);
  const Tensor adapted = (*m)->forward(x);
  REQUIRE(max_abs_diff(adapted, base.forward(x)) > 1e-3);  // the adapters matter
  models::Gpt plain(tiny(), 0);
  const auto merged = models::merged_state_dict(**m);
  for (const auto& [name, t] : merged) REQUIRE(name.find("lora") == std::string::npos);
  REQUIRE(plain.load_state_dict(merged).ok());
  REQUIRE(max_abs_diff(plain.forward(x), adapted) < 1e-5);
  // Merging does not touch the shared base.
  REQUIRE(max_abs_diff(base.forward(x), adapted) > 1e-3);
}

TEST_CASE("lora dropout is active in training only", "[models][lora]") {
  models::Gpt base(tiny(), 1);
  auto s = spec(4);
  s.dropout = 0.5;
  auto m = models::make_gpt(tiny(), 5, &base, s);
  REQUIRE(m.ok());
  randomize_b(**m, 12);
  const Tensor x = ids(2, 8, 13, 9);
  starling::autograd::NoGradGuard ng;
  (*m)->train(true);
  const auto t1 = (*m)->forward(x).to_float_vector();
  const auto t2 = (*m)->forward(x).to_float_vector();
  REQUIRE(t1 != t2);  // fresh masks per call
  (*m)->train(false);
  REQUIRE((*m)->forward(x).to_float_vector() == (*m)->forward(x).to_float_vector());
}

TEST_CASE("[lora] validation names the key", "[models][lora]") {
  starling::v1::LoraConfig c;
  auto off = models::lora_spec_from_proto(c, "f.toml");
  REQUIRE(off.ok());
  REQUIRE_FALSE(off->enabled());
  c.set_rank(8);
  auto all = models::lora_spec_from_proto(c, "f.toml");
  REQUIRE(all.ok());
  REQUIRE(all->targets == models::lora_target_names());
  c.add_targets("attn.c_attn");
  c.add_targets("attn.q_proj");
  auto bad = models::lora_spec_from_proto(c, "f.toml");
  REQUIRE_FALSE(bad.ok());
  REQUIRE_THAT(bad.status().message(), Catch::Contains("f.toml: lora.targets") &&
                                           Catch::Contains("attn.q_proj") &&
                                           Catch::Contains("mlp.c_fc"));
  c.clear_targets();
  c.add_targets("mlp.c_fc");
  c.add_targets("mlp.c_fc");
  REQUIRE_THAT(models::lora_spec_from_proto(c, "f.toml").status().message(),
               Catch::Contains("twice"));
  c.clear_targets();
  c.set_alpha(0);
  REQUIRE_THAT(models::lora_spec_from_proto(c, "f.toml").status().message(),
               Catch::Contains("lora.alpha"));
  c.set_alpha(16);
  c.set_dropout(1.0f);
  REQUIRE_THAT(models::lora_spec_from_proto(c, "f.toml").status().message(),
               Catch::Contains("lora.dropout"));
}

TEST_CASE("make_gpt refuses a base of another shape", "[models][lora]") {
  auto other = tiny();
  other.n_embd = 32;
  models::Gpt base(other, 1);
  auto m = models::make_gpt(tiny(), 5, &base, spec(2));
  REQUIRE_FALSE(m.ok());
  REQUIRE_THAT(m.status().message(), Catch::Contains("transformer.wte.weight"));
}

TEST_CASE("the fused lora_linear op equals the composed ops, values and gradients",
          "[models][lora]") {
  Rng r(21);
  auto make = [&](starling::Shape s, double std) {
    return Tensor::randn(s, r, std, 0.0, DType::kF64).set_requires_grad(true);
  };
  const Tensor x = make({3, 5, 6}, 1.0), w = make({4, 6}, 0.3), bias = make({4}, 0.1),
               a = make({2, 6}, 0.3), b = make({4, 2}, 0.3);
  const Tensor fused = ops::lora_linear(x, w, bias, a, b, 1.5);
  const Tensor composed =
      ops::add(ops::linear(x, w, bias), ops::mul_scalar(ops::linear(ops::linear(x, a), b), 1.5));
  REQUIRE(max_abs_diff(fused, composed) < 1e-12);
  const Tensor weights = Tensor::randn({3, 5, 4}, r, 1.0, 0.0, DType::kF64);
  auto grads = [&](const Tensor& y) {
    for (Tensor t : {x, w, bias, a, b}) t.impl()->grad = nullptr;
    starling::autograd::backward(ops::sum(ops::mul(y, weights)));
    std::vector<Tensor> g;
    for (const Tensor& t : {x, w, bias, a, b}) g.push_back(t.grad().clone());
    return g;
  };
  const auto gf = grads(fused), gc = grads(composed);
  for (size_t i = 0; i < gf.size(); ++i) {
    INFO("input " << i);
    REQUIRE(max_abs_diff(gf[i], gc[i]) < 1e-12);
  }
  // Frozen weight and bias: float64 gradient check of what trains.
  const Tensor wf = w.detach().clone(), bf = bias.detach().clone();
  auto f = [&](const std::vector<Tensor>& in) {
    return ops::lora_linear(in[0], wf, bf, in[1], in[2], 1.5);
  };
  const auto res =
      starling::testing::gradcheck(f, {x.detach().clone(), a.detach().clone(), b.detach().clone()});
  INFO(res.worst);
  REQUIRE(res.max_rel_error < 1e-6);
}

TEST_CASE("linear_cross_entropy equals the head's logits through cross_entropy", "[models][lora]") {
  Rng r(31);
  const Tensor x = Tensor::randn({7, 5}, r, 1.0, 0.0, DType::kF64).set_requires_grad(true);
  const Tensor w = Tensor::randn({11, 5}, r, 0.5, 0.0, DType::kF64).set_requires_grad(true);
  const Tensor t = Tensor::from_vector(std::vector<int32_t>{3, 0, 10, -100, 4, 4, 9}, {7});
  // Chunks of 3 rows: three chunks, the last one partial; one row ignored.
  const Tensor fused = ops::linear_cross_entropy(x, w, t, 3);
  const Tensor plain = ops::cross_entropy(ops::linear(x, w), t);
  REQUIRE(std::fabs(fused.item() - plain.item()) < 1e-12);
  auto grads = [&](const Tensor& loss) {
    x.impl()->grad = nullptr;
    w.impl()->grad = nullptr;
    starling::autograd::backward(ops::mul_scalar(loss, 1.7));
    return std::make_pair(x.grad().clone(), w.grad().clone());
  };
  const auto [gxf, gwf] = grads(fused);
  const auto [gxp, gwp] = grads(plain);
  REQUIRE(max_abs_diff(gxf, gxp) < 1e-12);
  REQUIRE(max_abs_diff(gwf, gwp) < 1e-12);
  auto f = [&](const std::vector<Tensor>& in) {
    return ops::linear_cross_entropy(in[0], in[1], t, 2);
  };
  const auto res = starling::testing::gradcheck(f, {x.detach().clone(), w.detach().clone()});
  INFO(res.worst);
  REQUIRE(res.max_rel_error < 1e-6);
}
