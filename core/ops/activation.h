// Pointwise activations: GELU (exact erf form, or the tanh approximation of GPT-2) and SiLU.
#pragma once

#include "core/tensor/tensor.h"

namespace starling::ops {

enum class GeluApprox { kNone, kTanh };

Tensor gelu(const Tensor& x, GeluApprox approx = GeluApprox::kNone);
Tensor silu(const Tensor& x);

}  // namespace starling::ops
