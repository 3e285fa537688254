// Optimizers against hand-computed updates, clipping and the learning-rate schedule.
#include "core/optim/optimizer.h"

#include <catch2/catch.hpp>
#include <cmath>

#include "core/ops/ops.h"

using starling::Tensor;
namespace optim = starling::optim;

namespace {
Tensor param(std::vector<double> v) {
  Tensor t = Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
  t.set_requires_grad(true);
  return t;
}
void set_grad(Tensor& p, std::vector<double> g) {
  p.set_grad(Tensor::from_vector(g, {static_cast<int64_t>(g.size())}));
}
}  // namespace

TEST_CASE("adamw matches torch.optim.AdamW's update rule", "[optim]") {
  Tensor p = param({1.0, -2.0});
  optim::AdamW opt({{p, true}}, {0.9, 0.999, 1e-8, 0.1});
  const double lr = 0.01;
  double m[2] = {0, 0}, v[2] = {0, 0}, ref[2] = {1.0, -2.0};
  for (int step = 1; step <= 3; ++step) {
    const double g[2] = {0.5 * step, -1.0};
    set_grad(p, {g[0], g[1]});
    opt.step(lr);
    for (int i = 0; i < 2; ++i) {
      ref[i] *= 1 - lr * 0.1;
      m[i] = 0.9 * m[i] + 0.1 * g[i];
      v[i] = 0.999 * v[i] + 0.001 * g[i] * g[i];
      const double mh = m[i] / (1 - std::pow(0.9, step)), vh = v[i] / (1 - std::pow(0.999, step));
      ref[i] -= lr * mh / (std::sqrt(vh) + 1e-8);
    }
    auto got = p.to_double_vector();
    REQUIRE(got[0] == Approx(ref[0]).epsilon(1e-12));
    REQUIRE(got[1] == Approx(ref[1]).epsilon(1e-12));
  }
}

TEST_CASE("adamw skips weight decay where the group says so", "[optim]") {
  Tensor p = param({1.0});
  optim::AdamW opt({{p, false}}, {0.9, 0.999, 1e-8, 0.5});
  set_grad(p, {0.0});
  opt.step(0.1);
  REQUIRE(p.item() == 1.0);
}

TEST_CASE("sgd with momentum and weight decay", "[optim]") {
  Tensor p = param({1.0});
  optim::Sgd opt({{p, true}}, {0.9, 0.1, false});
  set_grad(p, {1.0});
  opt.step(0.1);  // d = 1 + 0.1 = 1.1, v = 1.1, p = 1 - 0.11
  REQUIRE(p.item() == Approx(0.89));
  set_grad(p, {1.0});
  opt.step(0.1);  // d = 1 + 0.089 = 1.089, v = 0.99 + 1.089 = 2.079
  REQUIRE(p.item() == Approx(0.89 - 0.2079));
}

TEST_CASE("gradient clipping scales to the max norm", "[optim]") {
  Tensor a = param({3.0}), b = param({4.0});
  set_grad(a, {3.0});
  set_grad(b, {4.0});
  const double n = optim::clip_grad_norm({a, b}, 1.0);
  REQUIRE(n == Approx(5.0));
  REQUIRE(a.grad().item() == Approx(0.6).epsilon(1e-5));
  REQUIRE(b.grad().item() == Approx(0.8).epsilon(1e-5));
  REQUIRE(optim::clip_grad_norm({a, b}, 10.0) == Approx(1.0).epsilon(1e-5));
}

TEST_CASE("warmup then cosine decay, as nanoGPT's get_lr", "[optim]") {
  const optim::CosineSchedule s{1e-3, 1e-4, 100, 2000};
  REQUIRE(s.at(0) == Approx(1e-3 * 1 / 101));
  REQUIRE(s.at(99) == Approx(1e-3 * 100 / 101));
  REQUIRE(s.at(100) == Approx(1e-3));
  REQUIRE(s.at(1050) == Approx(1e-4 + 0.5 * 0.9e-3));
  REQUIRE(s.at(2000) == Approx(1e-4));
  REQUIRE(s.at(5000) == Approx(1e-4));
}

TEST_CASE("optimizer minimizes a quadratic", "[optim]") {
  Tensor w = param({5.0, -3.0});
  optim::AdamW opt({{w, false}}, {0.9, 0.999, 1e-8, 0.0});
  for (int i = 0; i < 500; ++i) {
    Tensor loss = starling::ops::sum(starling::ops::square(w));
    starling::autograd::backward(loss);
    opt.step(0.05);
    opt.zero_grad();
  }
  REQUIRE(std::fabs(w.to_double_vector()[0]) < 1e-2);
  REQUIRE(std::fabs(w.to_double_vector()[1]) < 1e-2);
}
