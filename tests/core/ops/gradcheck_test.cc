// Every differentiable op against central differences in float64.
#include "tests/testing/gradcheck.h"

#include <catch2/catch.hpp>

#include "core/ops/ops.h"

using starling::DType;
using starling::Tensor;
using starling::testing::gradcheck;
using starling::testing::rand64;
namespace ops = starling::ops;

namespace {
constexpr double kTol = 1e-6;

#define CHECK_GRAD(expr_fn, ...)                \
  do {                                          \
    auto r = gradcheck(expr_fn, {__VA_ARGS__}); \
    INFO(r.worst);                              \
    REQUIRE(r.max_rel_error < kTol);            \
  } while (0)
}  // namespace

TEST_CASE("gradcheck: broadcasting arithmetic", "[ops][grad]") {
  auto [sa, sb] = GENERATE(table<starling::Shape, starling::Shape>(
      {{{3, 4}, {3, 4}}, {{2, 3, 4}, {4}}, {{2, 1, 4}, {3, 1}}, {{5}, {}}}));
  Tensor a = rand64(sa, 1), b = rand64(sb, 2);
  CHECK_GRAD([](const auto& x) { return ops::add(x[0], x[1]); }, a.clone(), b.clone());
  CHECK_GRAD([](const auto& x) { return ops::sub(x[0], x[1]); }, a.clone(), b.clone());
  CHECK_GRAD([](const auto& x) { return ops::mul(x[0], x[1]); }, a.clone(), b.clone());
  Tensor bpos = ops::add_scalar(ops::square(b), 0.5);
  CHECK_GRAD([](const auto& x) { return ops::div(x[0], x[1]); }, a.clone(), bpos.clone());
}

TEST_CASE("gradcheck: unary math", "[ops][grad]") {
  Tensor a = rand64({3, 5}, 3);
  Tensor pos = ops::add_scalar(ops::square(a), 0.3);
  CHECK_GRAD([](const auto& x) { return ops::exp(x[0]); }, a.clone());
  CHECK_GRAD([](const auto& x) { return ops::log(x[0]); }, pos.clone());
  CHECK_GRAD([](const auto& x) { return ops::sqrt(x[0]); }, pos.clone());
  CHECK_GRAD([](const auto& x) { return ops::tanh(x[0]); }, a.clone());
  CHECK_GRAD([](const auto& x) { return ops::square(x[0]); }, a.clone());
  CHECK_GRAD([](const auto& x) { return ops::mul_scalar(ops::add_scalar(x[0], 2.0), -3.0); },
             a.clone());
}

TEST_CASE("gradcheck: views", "[ops][grad]") {
  Tensor a = rand64({2, 3, 4}, 4);
  CHECK_GRAD([](const auto& x) { return ops::reshape(x[0], {6, 4}); }, a.clone());
  CHECK_GRAD([](const auto& x) { return ops::contiguous(ops::transpose(x[0], 0, 2)); }, a.clone());
  CHECK_GRAD([](const auto& x) { return ops::slice(x[0], 2, 1, 3); }, a.clone());
}

TEST_CASE("gradcheck: reductions", "[ops][grad]") {
  Tensor a = rand64({3, 4, 5}, 5);
  CHECK_GRAD([](const auto& x) { return ops::sum(x[0]); }, a.clone());
  CHECK_GRAD([](const auto& x) { return ops::mean(x[0]); }, a.clone());
  for (int64_t d : {0, 1, 2, -1}) {
    CHECK_GRAD([d](const auto& x) { return ops::sum(x[0], d, false); }, a.clone());
    CHECK_GRAD([d](const auto& x) { return ops::mean(x[0], d, true); }, a.clone());
  }
}

TEST_CASE("gradcheck: matmul, batched matmul and linear", "[ops][grad]") {
  CHECK_GRAD([](const auto& x) { return ops::matmul(x[0], x[1]); }, rand64({3, 5}, 1),
             rand64({5, 4}, 2));
  CHECK_GRAD([](const auto& x) { return ops::matmul(x[0], x[1]); }, rand64({2, 3, 5}, 1),
             rand64({5, 4}, 2));
  CHECK_GRAD([](const auto& x) { return ops::matmul(x[0], x[1]); }, rand64({2, 3, 5}, 1),
             rand64({2, 5, 4}, 2));
  // A transposed view goes to BLAS without a copy.
  CHECK_GRAD([](const auto& x) { return ops::matmul(x[0], ops::transpose(x[1], 0, 1)); },
             rand64({3, 5}, 1), rand64({4, 5}, 2));
  CHECK_GRAD([](const auto& x) { return ops::linear(x[0], x[1], x[2]); }, rand64({2, 3, 5}, 1),
             rand64({4, 5}, 2), rand64({4}, 3));
  CHECK_GRAD([](const auto& x) { return ops::linear(x[0], x[1]); }, rand64({7, 5}, 1),
             rand64({3, 5}, 2));
}

TEST_CASE("gradcheck: embedding", "[ops][grad]") {
  Tensor ids = Tensor::from_vector(std::vector<int32_t>{0, 3, 3, 1, 4, 0}, {2, 3});
  CHECK_GRAD([ids](const auto& x) { return ops::embedding(x[0], ids); }, rand64({5, 4}, 1));
}

TEST_CASE("gradcheck: layer norm", "[ops][grad]") {
  CHECK_GRAD([](const auto& x) { return ops::layer_norm(x[0], x[1], x[2]); }, rand64({2, 3, 6}, 1),
             rand64({6}, 2), rand64({6}, 3));
  CHECK_GRAD([](const auto& x) { return ops::layer_norm(x[0], x[1], Tensor()); }, rand64({4, 5}, 1),
             rand64({5}, 2));
}

TEST_CASE("gradcheck: activations and softmax", "[ops][grad]") {
  Tensor a = rand64({4, 7}, 9, 2.0);
  CHECK_GRAD([](const auto& x) { return ops::gelu(x[0]); }, a.clone());
  CHECK_GRAD([](const auto& x) { return ops::gelu(x[0], ops::GeluApprox::kTanh); }, a.clone());
  CHECK_GRAD([](const auto& x) { return ops::silu(x[0]); }, a.clone());
  CHECK_GRAD([](const auto& x) { return ops::softmax(x[0]); }, a.clone());
  CHECK_GRAD([](const auto& x) { return ops::log_softmax(x[0]); }, a.clone());
}

TEST_CASE("gradcheck: attention, causal and bidirectional", "[ops][grad]") {
  const bool causal = GENERATE(true, false);
  // T = 5, C = 6, H = 2 (D = 3): sizes that are not powers of two.
  CHECK_GRAD([causal](const auto& x) { return ops::attention_packed(x[0], 2, causal); },
             rand64({2, 5, 18}, 1));
  CHECK_GRAD([causal](const auto& x) { return ops::attention(x[0], x[1], x[2], causal); },
             rand64({1, 2, 4, 3}, 1), rand64({1, 2, 4, 3}, 2), rand64({1, 2, 4, 3}, 3));
}

TEST_CASE("gradcheck: cross entropy", "[ops][grad]") {
  Tensor targets = Tensor::from_vector(std::vector<int32_t>{2, 0, 4, -100, 1}, {5});
  CHECK_GRAD([targets](const auto& x) { return ops::cross_entropy(x[0], targets); },
             rand64({5, 6}, 1, 2.0));
}

TEST_CASE("gradcheck: attention with block masks", "[ops][grad]") {
  // Block-causal over T = 6 in blocks of 2; the block-diffusion layout over 2 x 4 in blocks of 2.
  CHECK_GRAD(
      [](const auto& x) { return ops::attention_packed(x[0], 2, ops::AttnMask::block_causal(2)); },
      rand64({2, 6, 18}, 4));
  CHECK_GRAD(
      [](const auto& x) {
        return ops::attention_packed(x[0], 2, ops::AttnMask::block_diffusion(2));
      },
      rand64({1, 8, 18}, 5));
}

TEST_CASE("gradcheck: weighted cross entropy", "[ops][grad]") {
  Tensor targets = Tensor::from_vector(std::vector<int32_t>{2, 0, 4, -100, 1}, {5});
  const std::vector<double> w{0.5, 2.0, 0.0, 7.0, 1.25};
  auto loss = [targets, w](const auto& x) { return ops::weighted_cross_entropy(x[0], targets, w); };
  CHECK_GRAD(loss, rand64({5, 6}, 1, 2.0));
}

TEST_CASE("gradcheck: dropout keeps its mask for backward", "[ops][grad]") {
  CHECK_GRAD(
      [](const auto& x) {
        starling::Rng rng(5);  // same mask on every evaluation
        return ops::dropout(x[0], 0.3, true, rng);
      },
      rand64({6, 5}, 1));
}
