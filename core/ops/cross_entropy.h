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

// Mean cross-entropy of the logits x W^T against `targets` without holding them: x (N, C),
// w (V, C) (a tied head: the token embedding), targets (N) i32 or ignore_index. Rows go through
// in chunks of `chunk`, so at most chunk x V logits exist at a time, in the forward pass and
// again (recomputed) in the backward one; only the N log-sum-exps are kept. Equals
// cross_entropy(linear(x, w), targets) up to float rounding; a frozen w gets no gradient.
Tensor linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets,
                            int64_t chunk = 256, int32_t ignore_index = -100);

}  // namespace starling::ops
