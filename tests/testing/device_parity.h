// One op on the CPU and on a device from the same inputs: the forward results and the gradients
// of every input that requires one must agree within `rel` (relative to the largest magnitude of
// the CPU value, so that tiny entries do not dominate). rel = 0 asks for bit-identical results
// (the emulated device); the CUDA parity tests ask for 1e-5.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/autograd/autograd.h"
#include "core/ops/ops.h"
#include "core/tensor/tensor.h"
#include "core/util/rng.h"
#include "tests/testing/normalized_error.h"

namespace starling::testing {

// normalized_error of a device result against the CPU's (host float vectors of one size).
inline double device_error(const std::vector<float>& cpu, const std::vector<float>& dev) {
  REQUIRE(cpu.size() == dev.size());
  return normalized_error(dev.data(), cpu.data(), cpu.size());
}

// inputs: host tensors (f32 or i32); those with requires_grad get gradients compared. fn builds
// the op from the inputs (all on one device). The upstream gradient is a fixed random tensor of
// the output's shape, so every output element matters.
inline void check_device_parity(const std::string& what, const std::vector<Tensor>& inputs,
                                const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                                Device device, double rel, uint64_t seed = 7) {
  INFO(what);
  std::vector<Tensor> cpu, dev;
  for (const Tensor& t : inputs) {
    if (!t.defined()) {
      cpu.emplace_back();
      dev.emplace_back();
      continue;
    }
    Tensor c = t.clone();
    Tensor d = *t.to(device);
    if (t.requires_grad()) {
      c.set_requires_grad(true);
      d.set_requires_grad(true);
    }
    cpu.push_back(c);
    dev.push_back(d);
  }
  const Tensor yc = fn(cpu);
  const Tensor yd = fn(dev);
  REQUIRE(yd.device() == device);
  REQUIRE(yd.shape() == yc.shape());
  const std::vector<float> fc = yc.to_float_vector(), fd = yd.to_float_vector();
  const double fwd = device_error(fc, fd);
  INFO("forward relative error " << fwd);
  CHECK(fwd <= rel);
  if (!yc.requires_grad()) return;
  Rng rng(seed);
  const Tensor g = Tensor::randn(yc.shape(), rng);
  autograd::backward(yc, g);
  autograd::backward(yd, *g.to(device));
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined() || !inputs[i].requires_grad()) continue;
    INFO("gradient of input " << i);
    REQUIRE(cpu[i].grad().defined());
    REQUIRE(dev[i].grad().defined());
    CHECK(dev[i].grad().device() == device);
    const double e = device_error(cpu[i].grad().to_float_vector(), dev[i].grad().to_float_vector());
    INFO("relative error " << e);
    CHECK(e <= rel);
  }
}

}  // namespace starling::testing
