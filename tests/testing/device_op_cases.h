// Every op with a device form (core/ops/device_ops.h), each at small shapes the image models use,
// forward and backward on `device` against the CPU (check_device_parity). The emulated-device
// test runs them with rel = 0; tests/cuda/device_ops_cuda_test.cc with the CUDA table.
#pragma once

#include <cstdint>
#include <vector>

#include "core/ops/activation.h"
#include "core/ops/attention.h"
#include "core/ops/concat.h"
#include "core/ops/conv.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/dropout.h"
#include "core/ops/elementwise.h"
#include "core/ops/layer_norm.h"
#include "core/ops/matmul.h"
#include "core/ops/norm2d.h"
#include "core/ops/pool.h"
#include "core/ops/reduce.h"
#include "core/ops/relu.h"
#include "core/ops/time_embedding.h"
#include "core/util/rng.h"
#include "tests/testing/device_parity.h"

namespace starling::testing {

inline Tensor grad_input(const Shape& s, Rng& rng, double scale = 1.0) {
  Tensor t = Tensor::randn(s, rng, scale);
  t.set_requires_grad(true);
  return t;
}

// Values away from 0 (relu's kink) and from each other within a pooling window (max ties).
inline Tensor spread_input(const Shape& s, Rng& rng) {
  const int64_t n = shape_numel(s);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double u = 0.05 + 0.01 * static_cast<double>((i * 7919) % n);
    v[static_cast<size_t>(i)] = static_cast<float>(rng.uniform() < 0.5 ? -u : u);
  }
  Tensor t = Tensor::from_vector(v, s);
  t.set_requires_grad(true);
  return t;
}

inline void run_device_op_cases(Device dev, double rel) {
  Rng rng(20261205);
  using V = const std::vector<Tensor>&;

  // Convolutions: the U-Net's 3x3 (bias, residual), its stride-2 downsample, the 1x1 skip and
  // the CNN's 5x5 with padding 2.
  check_device_parity(
      "conv2d 3x3 pad 1, bias, residual",
      {grad_input({2, 4, 6, 6}, rng), grad_input({5, 4, 3, 3}, rng, 0.2), grad_input({5}, rng),
       grad_input({2, 5, 6, 6}, rng)},
      [](V t) { return ops::conv2d(t[0], t[1], t[2], 1, 1, t[3]); }, dev, rel);
  check_device_parity(
      "conv2d 3x3 stride 2",
      {grad_input({2, 4, 8, 8}, rng), grad_input({4, 4, 3, 3}, rng, 0.2), grad_input({4}, rng)},
      [](V t) { return ops::conv2d(t[0], t[1], t[2], 2, 1); }, dev, rel);
  check_device_parity(
      "conv2d 1x1 no bias", {grad_input({2, 6, 5, 5}, rng), grad_input({3, 6, 1, 1}, rng, 0.3)},
      [](V t) { return ops::conv2d(t[0], t[1]); }, dev, rel);
  check_device_parity(
      "conv2d 5x5 pad 2",
      {grad_input({3, 1, 12, 12}, rng), grad_input({4, 1, 5, 5}, rng, 0.2), grad_input({4}, rng)},
      [](V t) { return ops::conv2d(t[0], t[1], t[2], 1, 2); }, dev, rel);

  // Group norms: plain, with SiLU, with the time embedding's shift.
  const Shape gs = {2, 8, 5, 5};
  check_device_parity(
      "group_norm", {grad_input(gs, rng, 2.0), grad_input({8}, rng), grad_input({8}, rng)},
      [](V t) { return ops::group_norm(t[0], 4, t[1], t[2]); }, dev, rel);
  check_device_parity(
      "group_norm_silu", {grad_input(gs, rng, 2.0), grad_input({8}, rng), grad_input({8}, rng)},
      [](V t) { return ops::group_norm_silu(t[0], 2, t[1], t[2]); }, dev, rel);
  check_device_parity(
      "shifted_group_norm_silu",
      {grad_input(gs, rng, 2.0), grad_input({2, 8}, rng), grad_input({8}, rng),
       grad_input({8}, rng)},
      [](V t) { return ops::shifted_group_norm_silu(t[0], t[1], 8, t[2], t[3]); }, dev, rel);

  // Linear over (B, T, in) rows and over (B, in), with and without bias.
  check_device_parity(
      "linear 3-d with bias",
      {grad_input({2, 6, 8}, rng), grad_input({12, 8}, rng, 0.3), grad_input({12}, rng)},
      [](V t) { return ops::linear(t[0], t[1], t[2]); }, dev, rel);
  check_device_parity(
      "linear 2-d without bias", {grad_input({5, 7}, rng), grad_input({3, 7}, rng, 0.3)},
      [](V t) { return ops::linear(t[0], t[1]); }, dev, rel);

  // Pointwise and reductions.
  check_device_parity(
      "silu", {grad_input({3, 17}, rng, 3.0)}, [](V t) { return ops::silu(t[0]); }, dev, rel);
  check_device_parity(
      "relu", {spread_input({4, 9}, rng)}, [](V t) { return ops::relu(t[0]); }, dev, rel);
  check_device_parity(
      "square", {grad_input({33}, rng)}, [](V t) { return ops::square(t[0]); }, dev, rel);
  check_device_parity(
      "add", {grad_input({2, 3, 4}, rng), grad_input({2, 3, 4}, rng)},
      [](V t) { return ops::add(t[0], t[1]); }, dev, rel);
  check_device_parity(
      "sub", {grad_input({2, 3, 4}, rng), grad_input({2, 3, 4}, rng)},
      [](V t) { return ops::sub(t[0], t[1]); }, dev, rel);
  check_device_parity(
      "mul", {grad_input({2, 3, 4}, rng), grad_input({2, 3, 4}, rng)},
      [](V t) { return ops::mul(t[0], t[1]); }, dev, rel);
  check_device_parity(
      "mul_scalar", {grad_input({5, 5}, rng)}, [](V t) { return ops::mul_scalar(t[0], -0.75); },
      dev, rel);
  check_device_parity(
      "mse: mean(square(sub))", {grad_input({4, 1, 6, 6}, rng), grad_input({4, 1, 6, 6}, rng)},
      [](V t) { return ops::mean(ops::square(ops::sub(t[0], t[1]))); }, dev, rel);

  // Layout: concatenation along channels, transposes made contiguous, reshapes.
  check_device_parity(
      "cat along channels", {grad_input({2, 3, 4, 4}, rng), grad_input({2, 5, 4, 4}, rng)},
      [](V t) {
        return ops::cat({t[0], t[1]}, 1);
      },
      dev, rel);
  check_device_parity(
      "transpose, contiguous, reshape", {grad_input({2, 6, 3, 4}, rng)},
      [](V t) {
        const Tensor s = ops::reshape(t[0], {2, 6, 12});
        return ops::reshape(ops::contiguous(ops::transpose(s, 1, 2)), {2, 72});
      },
      dev, rel);

  // Resampling.
  check_device_parity(
      "upsample_nearest2d x2", {grad_input({2, 3, 4, 5}, rng)},
      [](V t) { return ops::upsample_nearest2d(t[0], 2); }, dev, rel);
  check_device_parity(
      "max_pool2d 2", {spread_input({2, 3, 8, 8}, rng)},
      [](V t) { return ops::max_pool2d(t[0], 2); }, dev, rel);
  check_device_parity(
      "max_pool2d 2 on odd sides", {spread_input({1, 2, 7, 9}, rng)},
      [](V t) { return ops::max_pool2d(t[0], 2); }, dev, rel);

  // The time embedding (no gradient), attention over positions, the classifier's loss.
  check_device_parity(
      "timestep_embedding", {Tensor::from_vector(std::vector<float>{0, 3, 999, 41.5f}, {4})},
      [](V t) { return ops::timestep_embedding(t[0], 16); }, dev, rel);
  check_device_parity(
      "attention_packed full", {grad_input({2, 9, 24}, rng)},
      [](V t) { return ops::attention_packed(t[0], 2, false); }, dev, rel);
  check_device_parity(
      "attention_packed causal", {grad_input({2, 7, 12}, rng)},
      [](V t) { return ops::attention_packed(t[0], 1, true); }, dev, rel);
  check_device_parity(
      "cross_entropy with an ignored row",
      {grad_input({6, 10}, rng, 2.0),
       Tensor::from_vector(std::vector<int32_t>{3, 0, 9, -100, 5, 5}, {6})},
      [](V t) { return ops::cross_entropy(t[0], t[1]); }, dev, rel);

  // Dropout: the mask is drawn on the host from the same stream on both devices.
  check_device_parity(
      "dropout p 0.25", {grad_input({4, 8}, rng)},
      [](V t) {
        Rng r(5);
        return ops::dropout(t[0], 0.25, true, r);
      },
      dev, rel);
}

}  // namespace starling::testing
