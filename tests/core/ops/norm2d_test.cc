// group_norm, timestep_embedding and cat: values against plain loops and known numbers, and
// float64 gradients against central differences.
#include "core/ops/norm2d.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/autograd/autograd.h"
#include "core/ops/activation.h"
#include "core/ops/concat.h"
#include "core/ops/ops.h"
#include "core/ops/time_embedding.h"
#include "tests/testing/gradcheck.h"

namespace starling::ops {
namespace {

using testing::gradcheck;
using testing::rand64;

TEST_CASE("group_norm matches per-group statistics", "[ops]") {
  const int64_t b = 2, c = 6, h = 3, w = 4;
  const auto groups = GENERATE(1, 2, 3, 6);
  const Tensor x = rand64({b, c, h, w}, 1, 2.0), wt = rand64({c}, 2), bs = rand64({c}, 3);
  const auto y = group_norm(x, groups, wt, bs).to_double_vector();
  const auto vx = x.to_double_vector(), vw = wt.to_double_vector(), vb = bs.to_double_vector();
  const int64_t cg = c / groups, len = cg * h * w;
  for (int64_t n = 0; n < b; ++n) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t base = (n * c + g * cg) * h * w;
      double m = 0, v = 0;
      for (int64_t i = 0; i < len; ++i) m += vx[base + i];
      m /= len;
      for (int64_t i = 0; i < len; ++i) v += (vx[base + i] - m) * (vx[base + i] - m);
      v /= len;
      for (int64_t i = 0; i < len; ++i) {
        const int64_t ch = g * cg + i / (h * w);
        const double want = (vx[base + i] - m) / std::sqrt(v + 1e-5) * vw[ch] + vb[ch];
        REQUIRE(y[base + i] == Approx(want).margin(1e-12));
      }
    }
  }
  // f32 agrees with f64.
  REQUIRE(
      max_abs_diff(group_norm(x.to(DType::kF32), groups, wt.to(DType::kF32), bs.to(DType::kF32)),
                   group_norm(x, groups, wt, bs)) < 1e-4);
}

TEST_CASE("group_norm gradients match central differences", "[ops][grad]") {
  const auto groups = GENERATE(1, 2, 4);
  const auto r = gradcheck(
      [groups](const std::vector<Tensor>& in) { return group_norm(in[0], groups, in[1], in[2]); },
      {rand64({2, 4, 3, 2}, 1), rand64({4}, 2), rand64({4}, 3)});
  INFO(r.worst);
  REQUIRE(r.max_rel_error < 1e-6);
  const auto r2 =
      gradcheck([](const std::vector<Tensor>& in) { return group_norm(in[0], 2, in[1], Tensor()); },
                {rand64({3, 4, 5}, 4), rand64({4}, 5)});
  INFO(r2.worst);
  REQUIRE(r2.max_rel_error < 1e-6);
}

TEST_CASE("group_norm float32 gradients agree with float64", "[ops][grad]") {
  const auto groups = GENERATE(1, 2, 4);
  // An offset mean, as activations after a convolution have.
  const Tensor x0 = add(rand64({3, 8, 5, 7}, 6, 2.0), Tensor::full({1}, 3.0, DType::kF64));
  const Tensor w0 = rand64({8}, 7), b0 = rand64({8}, 8), r = rand64({3, 8, 5, 7}, 9);
  std::vector<Tensor> grads[2];
  for (const DType t : {DType::kF64, DType::kF32}) {
    Tensor x = x0.to(t), w = w0.to(t), b = b0.to(t);
    for (Tensor* v : {&x, &w, &b}) v->set_requires_grad(true);
    autograd::backward(sum(mul(group_norm(x, groups, w, b), r.to(t))));
    grads[t == DType::kF32] = {x.grad(), w.grad(), b.grad()};
  }
  for (size_t i = 0; i < 3; ++i) {
    CAPTURE(groups, i);
    REQUIRE(max_abs_diff(grads[1][i], grads[0][i]) < 2e-5);
  }
}

TEST_CASE("group_norm_silu: gradients match central differences", "[ops][grad]") {
  const auto groups = GENERATE(1, 2, 4);
  const auto r = gradcheck(
      [groups](const std::vector<Tensor>& in) {
        return group_norm_silu(in[0], groups, in[1], in[2]);
      },
      {rand64({2, 4, 3, 2}, 11, 2.0), rand64({4}, 12), rand64({4}, 13)});
  INFO(r.worst);
  REQUIRE(r.max_rel_error < 1e-6);
  const auto r2 = gradcheck(
      [](const std::vector<Tensor>& in) { return group_norm_silu(in[0], 2, in[1], Tensor()); },
      {rand64({3, 4, 5}, 14), rand64({4}, 15)});
  INFO(r2.worst);
  REQUIRE(r2.max_rel_error < 1e-6);
}

TEST_CASE("group_norm_silu equals silu(group_norm) in float32 and float64", "[ops][grad]") {
  const auto t = GENERATE(DType::kF64, DType::kF32);
  const Tensor x0 = rand64({3, 8, 5, 7}, 16, 2.0).to(t), w0 = rand64({8}, 17).to(t);
  const Tensor b0 = rand64({8}, 18).to(t), r = rand64({3, 8, 5, 7}, 19).to(t);
  std::vector<Tensor> got[2];
  for (const bool fused : {false, true}) {
    Tensor x = x0.detach(), w = w0.detach(), b = b0.detach();
    for (Tensor* v : {&x, &w, &b}) v->set_requires_grad(true);
    const Tensor y = fused ? group_norm_silu(x, 4, w, b) : silu(group_norm(x, 4, w, b));
    autograd::backward(sum(mul(y, r)));
    got[fused] = {y.detach(), x.grad(), w.grad(), b.grad()};
  }
  const double tol = t == DType::kF32 ? 1e-5 : 1e-12;
  for (size_t i = 0; i < 4; ++i) {
    CAPTURE(dtype_name(t), i);
    REQUIRE(max_abs_diff(got[1][i], got[0][i]) < tol);
  }
}

TEST_CASE("shifted_group_norm_silu: gradients match central differences", "[ops][grad]") {
  // One and several channels per group; a shift far from the data's scale (the sums move by
  // n t and 2 t s1 + n t^2, so a large t tests the algebra, not rounding).
  const auto groups = GENERATE(1, 2, 4);
  const double scale = GENERATE(1.0, 30.0);
  CAPTURE(groups, scale);
  const auto r = gradcheck(
      [groups](const std::vector<Tensor>& in) {
        return shifted_group_norm_silu(in[0], in[3], groups, in[1], in[2]);
      },
      {rand64({2, 4, 3, 2}, 21, 2.0), rand64({4}, 22), rand64({4}, 23), rand64({2, 4}, 24, scale)});
  INFO(r.worst);
  REQUIRE(r.max_rel_error < 1e-6);
}

TEST_CASE("shifted_group_norm_silu equals group_norm_silu(x + shift) in float32 and float64",
          "[ops][grad]") {
  const auto t = GENERATE(DType::kF64, DType::kF32);
  const Tensor x0 = rand64({3, 8, 5, 7}, 25, 2.0).to(t), w0 = rand64({8}, 26).to(t);
  const Tensor b0 = rand64({8}, 27).to(t), s0 = rand64({3, 8}, 28, 3.0).to(t);
  const Tensor r = rand64({3, 8, 5, 7}, 29).to(t);
  std::vector<Tensor> got[2];
  for (const bool fused : {false, true}) {
    Tensor x = x0.detach(), w = w0.detach(), b = b0.detach(), sh = s0.detach();
    for (Tensor* v : {&x, &w, &b, &sh}) v->set_requires_grad(true);
    const Tensor y = fused ? shifted_group_norm_silu(x, sh, 4, w, b)
                           : group_norm_silu(add(x, reshape(sh, {3, 8, 1, 1})), 4, w, b);
    autograd::backward(sum(mul(y, r)));
    got[fused] = {y.detach(), x.grad(), w.grad(), b.grad(), sh.grad()};
  }
  // Relative to the largest value (the shift's gradient sums 35 positions).
  const double tol = t == DType::kF32 ? 1e-5 : 1e-12;
  for (size_t i = 0; i < 5; ++i) {
    CAPTURE(dtype_name(t), i);
    const double scale =
        std::max(1.0, max_abs_diff(got[0][i], Tensor::zeros(got[0][i].shape(), got[0][i].dtype())));
    REQUIRE(max_abs_diff(got[1][i], got[0][i]) / scale < tol);
  }
}

TEST_CASE("timestep_embedding: values and gradient", "[ops][grad]") {
  const Tensor t = Tensor::from_vector(std::vector<double>{0.0, 3.0, 250.0}, {3});
  const auto e = timestep_embedding(t, 8).to_double_vector();
  // f_i = 10000^(-i/3): 1, 0.0464, 0.00215, 0.0001.
  for (int64_t n = 0; n < 3; ++n) {
    const double tv = t.to_double_vector()[n];
    for (int64_t i = 0; i < 4; ++i) {
      const double f = std::pow(10000.0, -static_cast<double>(i) / 3.0);
      REQUIRE(e[n * 8 + i] == Approx(std::sin(tv * f)).margin(1e-12));
      REQUIRE(e[n * 8 + 4 + i] == Approx(std::cos(tv * f)).margin(1e-12));
    }
  }
  REQUIRE(timestep_embedding(t, 2).to_double_vector()[2] == Approx(std::sin(3.0)));
  const auto r =
      gradcheck([](const std::vector<Tensor>& in) { return timestep_embedding(in[0], 10, 100.0); },
                {rand64({4}, 1, 3.0)});
  INFO(r.worst);
  REQUIRE(r.max_rel_error < 1e-6);
}

TEST_CASE("cat joins along any dim and splits the gradient", "[ops][grad]") {
  const Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
  const Tensor b = Tensor::from_vector(std::vector<float>{5, 6}, {2, 1});
  REQUIRE(cat({a, b}, 1).to_float_vector() == std::vector<float>{1, 2, 5, 3, 4, 6});
  REQUIRE(cat({a, a}, 0).to_float_vector() == std::vector<float>{1, 2, 3, 4, 1, 2, 3, 4});
  REQUIRE(cat({a, b}, -1).shape() == Shape{2, 3});
  const auto dim = GENERATE(0, 1, 2, 3);
  Shape s2 = {2, 3, 4, 2};
  s2[dim] = 1;
  const auto r = gradcheck(
      [dim](const std::vector<Tensor>& in) {
        return cat({in[0], in[1], in[0]}, dim);
      },
      {rand64({2, 3, 4, 2}, 1), rand64(s2, 2)});
  INFO(r.worst);
  REQUIRE(r.max_rel_error < 1e-6);
}

}  // namespace
}  // namespace starling::ops
