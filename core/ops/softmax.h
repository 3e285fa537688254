// Softmax and log-softmax over the last dimension.
#pragma once

#include "core/tensor/tensor.h"

namespace starling::ops {

Tensor softmax(const Tensor& x);      // x: (..., N)
Tensor log_softmax(const Tensor& x);  // x: (..., N)

namespace internal {
// Row-wise softmax of n values in place; masked tail (j >= valid) set to 0.
template <typename T>
void softmax_row(T* row, int64_t n, int64_t valid);
}  // namespace internal

}  // namespace starling::ops
