// Gradient checker: analytic gradients from autograd against central differences, in float64.
// Header-only so that only test binaries that link core/ops pull it in.
#pragma once

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/ops/ops.h"
#include "core/util/rng.h"

namespace starling::testing {

struct GradCheckResult {
  double max_abs_error = 0.0;
  double max_rel_error = 0.0;
  std::string worst;  // "input 1 element 7: analytic .. numeric .."
};

// f maps f64 inputs to a tensor; the scalar checked is sum(f(inputs) * w) for a fixed random w,
// so every output element contributes with a different weight.
inline GradCheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                                 std::vector<Tensor> inputs, uint64_t seed = 1, double eps = 1e-6) {
  Rng rng(seed);
  for (auto& in : inputs) {
    if (dtype_is_float(in.dtype())) in.set_requires_grad(true);
  }
  Tensor out = f(inputs);
  const Tensor w = Tensor::randn(out.shape(), rng, 1.0, 0.0, DType::kF64);
  Tensor loss = ops::sum(ops::mul(out, w));
  autograd::backward(loss);

  auto objective = [&]() {
    autograd::NoGradGuard ng;
    const auto o = f(inputs).to_double_vector();
    const auto wv = w.to_double_vector();
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += o[i] * wv[i];
    return s;
  };

  GradCheckResult res;
  for (size_t t = 0; t < inputs.size(); ++t) {
    Tensor& in = inputs[t];
    if (!in.requires_grad()) continue;
    const Tensor g = in.grad();
    const auto ga = g.defined() ? g.to_double_vector() : std::vector<double>(in.numel(), 0.0);
    double* p = in.data<double>();
    for (int64_t i = 0; i < in.numel(); ++i) {
      const double orig = p[i];
      p[i] = orig + eps;
      const double up = objective();
      p[i] = orig - eps;
      const double down = objective();
      p[i] = orig;
      const double num = (up - down) / (2 * eps);
      const double abs_err = std::fabs(num - ga[i]);
      const double rel = abs_err / std::max(1.0, std::fabs(num));
      if (rel > res.max_rel_error || std::isnan(rel)) {
        res.worst = "input " + std::to_string(t) + " element " + std::to_string(i) + ": analytic " +
                    std::to_string(ga[i]) + " numeric " + std::to_string(num);
      }
      res.max_abs_error = std::max(res.max_abs_error, abs_err);
      res.max_rel_error = std::isnan(rel) ? rel : std::max(res.max_rel_error, rel);
    }
  }
  return res;
}

inline Tensor rand64(const Shape& s, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  return Tensor::randn(s, rng, scale, 0.0, DType::kF64);
}

}  // namespace starling::testing
