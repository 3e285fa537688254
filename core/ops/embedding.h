// Embedding lookup: rows of a table gathered by integer ids.
#pragma once

#include "core/tensor/tensor.h"

namespace starling::ops {

// weight: (V, C) f32/f64, ids: any shape, i32 with values in [0, V) -> (ids..., C).
// Out-of-range ids abort (ids come from our tokenizers, never from peers).
Tensor embedding(const Tensor& weight, const Tensor& ids);

}  // namespace starling::ops
