// Cross-entropy of logits against integer targets, with the log-softmax fused in.
#pragma once

#include <span>

#include "core/tensor/tensor.h"

namespace starling::ops {

// logits: (N, V) f32/f64, targets: (N) i32 in [0, V) or ignore_index -> scalar mean loss over
// the non-ignored rows (0 when every row is ignored).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int32_t ignore_index = -100);

// sum_i weights[i] * CE_i over the non-ignored rows (0 when every row is ignored): a per-row
// weighted loss in one op. weights: N values, not differentiated.
Tensor weighted_cross_entropy(const Tensor& logits, const Tensor& targets,
                              std::span<const double> weights, int32_t ignore_index = -100);

}  // namespace starling::ops
