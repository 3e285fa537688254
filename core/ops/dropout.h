// Inverted dropout: zero each element with probability p and scale the rest by 1/(1-p).
#pragma once

#include "core/tensor/tensor.h"
#include "core/util/rng.h"

namespace starling::ops {

// Identity when !training or p == 0. REQUIRES: 0 <= p < 1. Draws one number per element.
Tensor dropout(const Tensor& x, double p, bool training, Rng& rng);

}  // namespace starling::ops
