// Rectified linear unit: y = max(x, 0), with gradient 1 where x > 0 and 0 elsewhere.
#pragma once

#include "core/tensor/tensor.h"

namespace starling::ops {

// x: any shape, f32 or f64 -> same shape, contiguous.
Tensor relu(const Tensor& x);

}  // namespace starling::ops
