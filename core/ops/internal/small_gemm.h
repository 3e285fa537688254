// Products with few rows (m <= kSmallGemmRows): a federated client's linear layers at batch 10,
// where OpenBLAS packs all of B for ten rows of A and runs 3-5x below the time it takes to read
// B once. These kernels read B once, straight from where it lies. Built per instruction set
// beside the convolution kernels (conv_kernels.h: the same units, the same run-time choice).
#pragma once

#include <cstdint>

namespace starling::ops::internal {

inline constexpr int64_t kSmallGemmRows = 16;

// C (m x n) = alpha A B + beta C, A (m x k) row-major with leading dimension lda, B either
// (n x k) (trans_b: C = A B^T) or (k x n), C (m x n). beta == 0: C is not read (it may hold
// NaN). Columns [n0, n1) only, so callers can split them over threads: every element of C is
// the same bits however they are split. REQUIRES: 1 <= m <= kSmallGemmRows.
struct SmallGemmArgs {
  bool trans_b;
  int64_t m, n, k;
  float alpha;
  const float* a;
  int64_t lda;
  const float* b;
  int64_t ldb;
  float beta;
  float* c;
  int64_t ldc;
  int64_t n0, n1;
};

void small_gemm(const SmallGemmArgs& g);
void small_gemm_generic(const SmallGemmArgs& g);
#if defined(__x86_64__)
void small_gemm_avx2(const SmallGemmArgs& g);
void small_gemm_avx512(const SmallGemmArgs& g);
#endif

}  // namespace starling::ops::internal
