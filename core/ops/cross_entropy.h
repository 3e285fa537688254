// Cross-entropy of logits against integer targets, with the log-softmax fused in.
#pragma once

#include "core/tensor/tensor.h"

namespace starling::ops {

// logits: (N, V) f32/f64, targets: (N) i32 in [0, V) or ignore_index -> scalar mean loss over
// the non-ignored rows (0 when every row is ignored).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int32_t ignore_index = -100);

}  // namespace starling::ops
