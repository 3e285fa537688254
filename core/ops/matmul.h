// Matrix products through BLAS: matmul (2-D, N-D x 2-D, and batched N-D x N-D) and the fused
// linear layer y = x W^T + b. Transposed views are passed to BLAS without copies.
#pragma once

#include "core/tensor/tensor.h"

namespace starling::ops {

// a: (..., M, K), b: (K, N) -> (..., M, N); or a: (B..., M, K), b: (B..., K, N) with equal
// batch dims -> (B..., M, N). f32 or f64.
Tensor matmul(const Tensor& a, const Tensor& b);

// x: (..., in), w: (out, in), bias: (out) or undefined -> (..., out).
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor());

// A linear layer with a low-rank adapter (LoRA), as one op: x W^T + b + scale (x A^T) B^T with
// a: (rank, in), b: (out, rank). Keeps only x, the weights and the (rows, rank) product for
// backward (not the three (rows, out) intermediates of the composed ops); a frozen W or b gets
// no gradient computed.
Tensor lora_linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& a,
                   const Tensor& b, double scale);

namespace internal {
// C (M,N) = alpha * op(A) op(B) + beta * C, row-major, leading dims in elements.
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);
}  // namespace internal

}  // namespace starling::ops
