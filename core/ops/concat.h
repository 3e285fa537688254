// Concatenation of tensors along one dimension (the U-Net's skip connections).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor/tensor.h"

namespace starling::ops {

// Joins `parts` along `dim` (negative counts from the end). Differentiable in every part.
// REQUIRES: at least one part; same rank, dtype (f32 or f64) and sizes except along `dim`.
Tensor cat(const std::vector<Tensor>& parts, int64_t dim);

}  // namespace starling::ops
