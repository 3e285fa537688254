// The bodies of small_gemm (small_gemm.h), written once over the vector policy V of
// conv_kernels_impl.h and included by each instruction set's unit after it.
#pragma once

#include <cstdint>

#include "core/ops/internal/small_gemm.h"

namespace starling::ops::internal {
namespace {

inline float small_gemm_out(const SmallGemmArgs& g, float sum, const float* c) {
  return g.beta == 0.0f ? g.alpha * sum : g.alpha * sum + g.beta * *c;
}

// C = A B^T: row j of B against the M rows of A, M accumulators, B's row read once.
template <class V, int M>
void small_gemm_nt(const SmallGemmArgs& g) {
  const int64_t kv = g.k / V::L * V::L;
  for (int64_t j = g.n0; j < g.n1; ++j) {
    const float* bj = g.b + j * g.ldb;
    typename V::T acc[M];
    for (int i = 0; i < M; ++i) acc[i] = V::zero();
    for (int64_t p = 0; p < kv; p += V::L) {
      const typename V::T bv = V::pin(V::load(bj + p));
      for (int i = 0; i < M; ++i) acc[i] = V::fma(V::load(g.a + i * g.lda + p), bv, acc[i]);
    }
    for (int i = 0; i < M; ++i) {
      float s = V::hsum(acc[i]);
      for (int64_t p = kv; p < g.k; ++p) s += g.a[i * g.lda + p] * bj[p];
      float* c = g.c + i * g.ldc + j;
      *c = small_gemm_out(g, s, c);
    }
  }
}

// C = A B: NV vectors of columns of M rows in registers, one row of B (NV vectors) and M
// broadcasts of A per step of k.
template <class V, int M, int NV>
inline void small_gemm_nn_tile(const SmallGemmArgs& g, int64_t j) {
  typename V::T acc[M][NV];
  for (int i = 0; i < M; ++i)
    for (int v = 0; v < NV; ++v) acc[i][v] = V::zero();
  for (int64_t p = 0; p < g.k; ++p) {
    const float* bp = g.b + p * g.ldb + j;
    typename V::T bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = V::pin(V::load(bp + v * V::L));
    for (int i = 0; i < M; ++i) {
      const typename V::T av = V::bcast(g.a + i * g.lda + p);
      for (int v = 0; v < NV; ++v) acc[i][v] = V::fma(av, bv[v], acc[i][v]);
    }
  }
  for (int i = 0; i < M; ++i)
    for (int v = 0; v < NV; ++v) {
      float* c = g.c + i * g.ldc + j + v * V::L;
      alignas(64) float t[V::L];
      V::store(t, acc[i][v]);
      for (int l = 0; l < V::L; ++l) c[l] = small_gemm_out(g, t[l], c + l);
    }
}

template <class V, int M>
void small_gemm_nn(const SmallGemmArgs& g) {
  // About 24 accumulators: M x NV.
  constexpr int NV = M <= 6 ? 4 : (M <= 12 ? 2 : 1);
  int64_t j = g.n0;
  for (; j + NV * V::L <= g.n1; j += NV * V::L) small_gemm_nn_tile<V, M, NV>(g, j);
  for (; j + V::L <= g.n1; j += V::L) small_gemm_nn_tile<V, M, 1>(g, j);
  for (; j < g.n1; ++j)
    for (int i = 0; i < M; ++i) {
      float s = 0.0f;
      for (int64_t p = 0; p < g.k; ++p) s += g.a[i * g.lda + p] * g.b[p * g.ldb + j];
      float* c = g.c + i * g.ldc + j;
      *c = small_gemm_out(g, s, c);
    }
}

template <class V, int M>
void small_gemm_rows(const SmallGemmArgs& g) {
  if (g.trans_b)
    small_gemm_nt<V, M>(g);
  else
    small_gemm_nn<V, M>(g);
}

// Rows in blocks of at most V::kGemmRows (the accumulators the registers hold).
template <class V>
void small_gemm_impl(const SmallGemmArgs& g0) {
  constexpr int kMax = V::kGemmRows;
  for (int64_t i0 = 0; i0 < g0.m; i0 += kMax) {
    SmallGemmArgs g = g0;
    g.m = g0.m - i0 < kMax ? g0.m - i0 : kMax;
    g.a = g0.a + i0 * g0.lda;
    g.c = g0.c + i0 * g0.ldc;
    switch (g.m) {
#define STARLING_SG_CASE(N)                     \
  case N:                                       \
    small_gemm_rows<V, (N <= kMax ? N : 1)>(g); \
    break;
      STARLING_SG_CASE(1)
      STARLING_SG_CASE(2)
      STARLING_SG_CASE(3)
      STARLING_SG_CASE(4)
      STARLING_SG_CASE(5)
      STARLING_SG_CASE(6)
      STARLING_SG_CASE(7)
      STARLING_SG_CASE(8)
      STARLING_SG_CASE(9)
      STARLING_SG_CASE(10)
      STARLING_SG_CASE(11)
      STARLING_SG_CASE(12)
      STARLING_SG_CASE(13)
      STARLING_SG_CASE(14)
      STARLING_SG_CASE(15)
      STARLING_SG_CASE(16)
#undef STARLING_SG_CASE
      default:
        break;
    }
  }
}

}  // namespace
}  // namespace starling::ops::internal
