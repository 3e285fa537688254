// Elementwise arithmetic with numpy broadcasting, and unary math, all differentiable.
// Inputs: f32 or f64, any strides; outputs are contiguous.
#pragma once

#include "core/tensor/tensor.h"

namespace starling::ops {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);

Tensor add_scalar(const Tensor& a, double s);
Tensor mul_scalar(const Tensor& a, double s);
Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);  // REQUIRES: a > 0
Tensor sqrt(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor square(const Tensor& a);

// Differentiable views and copies.
Tensor reshape(const Tensor& a, const Shape& shape);
Tensor transpose(const Tensor& a, int64_t d0, int64_t d1);
Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end);
Tensor contiguous(const Tensor& a);

}  // namespace starling::ops
