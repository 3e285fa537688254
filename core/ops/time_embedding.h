// Sinusoidal embedding of diffusion times (Ho et al. 2020, after the Transformer's positions).
#pragma once

#include <cstdint>

#include "core/tensor/tensor.h"

namespace starling::ops {

// t: (B) f32 or f64 -> (B, dim): [sin(t f_0) .. sin(t f_{h-1}), cos(t f_0) .. cos(t f_{h-1})]
// with h = dim / 2 and f_i = max_period^(-i / (h - 1)) (f_0 = 1; h = 1 gives f_0 = 1 alone),
// as DDPM's get_timestep_embedding. Differentiable in t. REQUIRES: dim even, dim >= 2.
Tensor timestep_embedding(const Tensor& t, int64_t dim, double max_period = 10000.0);

}  // namespace starling::ops
