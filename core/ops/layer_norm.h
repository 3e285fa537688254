// Layer normalization over the last dimension.
#pragma once

#include "core/tensor/tensor.h"

namespace starling::ops {

// x: (..., C), weight: (C), bias: (C) or undefined -> (..., C).
// y = (x - mean) / sqrt(var + eps) * weight + bias, var biased (as PyTorch).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);

}  // namespace starling::ops
