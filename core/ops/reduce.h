// Differentiable reductions: sum and mean over everything or over one dimension.
#pragma once

#include "core/tensor/tensor.h"

namespace starling::ops {

Tensor sum(const Tensor& a);  // -> shape ()
Tensor sum(const Tensor& a, int64_t dim, bool keepdim);
Tensor mean(const Tensor& a);
Tensor mean(const Tensor& a, int64_t dim, bool keepdim);

}  // namespace starling::ops
