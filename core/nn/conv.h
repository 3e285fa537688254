// Convolutional layers over NCHW tensors: Conv2d and GroupNorm, with PyTorch's parameter names
// and layouts ("weight" (C_out, C_in, kH, kW), "bias"), so state dicts map onto torch.nn.
#pragma once

#include <cstdint>

#include "core/nn/module.h"
#include "core/util/rng.h"

namespace starling::nn {

// torch.nn.Conv2d with a square kernel. Weight and bias initialized as PyTorch does:
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in * kernel^2.
class Conv2d : public Module {
 public:
  Conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding, bool bias,
         Rng& rng);
  Tensor forward(const Tensor& x) const;  // x: (B, in, H, W) -> (B, out, H', W')
  // forward(x) + residual, the sum formed as the output is written (ops::conv2d's residual).
  Tensor forward(const Tensor& x, const Tensor& residual) const;

  Tensor weight;
  Tensor bias;  // undefined when built without bias
  int64_t stride;
  int64_t padding;
};

// torch.nn.GroupNorm: weight ones, bias zeros.
class GroupNorm : public Module {
 public:
  GroupNorm(int64_t groups, int64_t channels, double eps = 1e-5);
  Tensor forward(const Tensor& x) const;  // x: (B, C, ...) -> same shape
  // silu(forward(x)), fused (ops::group_norm_silu).
  Tensor forward_silu(const Tensor& x) const;
  // silu(this(x + shift[:, :, None, None])), shift (B, C) (ops::shifted_group_norm_silu).
  Tensor forward_silu(const Tensor& x, const Tensor& shift) const;

  Tensor weight;
  Tensor bias;
  int64_t groups;
  double eps;
};

}  // namespace starling::nn
