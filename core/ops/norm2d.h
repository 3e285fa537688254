// Group normalization over NCHW tensors (Wu & He 2018), as torch.nn.GroupNorm.
#pragma once

#include <cstdint>

#include "core/tensor/tensor.h"

namespace starling::ops {

// x: (B, C, H, W) (or any (B, C, ...)), weight: (C), bias: (C) or undefined -> same shape.
// The C channels are split into `groups` consecutive groups; each (image, group) is normalized
// by its own mean and biased variance, then y = x_hat * weight[c] + bias[c].
// REQUIRES: groups >= 1 divides C.
Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias,
                  double eps = 1e-5);

// silu(group_norm(x, ...)) in one op: the normalized tensor is never stored, and forward and
// backward each pass over memory once (the U-Net's blocks normalize then activate).
Tensor group_norm_silu(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias,
                       double eps = 1e-5);

// group_norm_silu(x + shift[:, :, None, None], ...) with shift (B, C) of x's dtype (the U-Net's
// time embedding, one value per image and channel), without forming the sum: forward and
// backward read x as group_norm_silu does, and the shift's gradient (B, C) comes from the sums
// the input gradient already takes.
Tensor shifted_group_norm_silu(const Tensor& x, const Tensor& shift, int64_t groups,
                               const Tensor& weight, const Tensor& bias, double eps = 1e-5);

}  // namespace starling::ops
