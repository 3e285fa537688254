// The bodies of the direct convolution kernels (conv_kernels.h), written once over a vector
// policy V and included by one translation unit per instruction set, each compiled with its own
// target flags. Everything here lives in that unit's anonymous namespace and calls nothing from
// the standard library, so no code compiled for one instruction set can be linked in place of
// another's (no shared inline or template instantiations).
//
// V provides: type T, lane count L (divides kConvQuantum), load / store (unaligned), bcast
// (a float from memory into every lane), fma(a, b, c) = a * b + c, zero(), hsum (sum of the
// lanes, in a fixed order), pin (the value, held in a register: an empty asm that stops the
// compiler from folding one load into every instruction that uses it); and register budgets:
// kCorrVecs (position vectors per output block in `correlate`'s register tile) and, for
// `weight_grad`'s tiles, kGradRows3 / kGradRows5 (rows of a 3- or 5-wide kernel) and kGradTaps
// (single taps), each at most 9.
#pragma once

#include <cstdint>

#include "core/ops/internal/conv_kernels.h"

namespace starling::ops::internal {
namespace {

// One register tile: kConvOutBlock output channels x PV vectors of positions from p0. kOne: a
// single tap (1x1 products), its loop gone.
template <class V, int PV, bool kOne>
inline void correlate_tile(const CorrelateArgs& a, const float* w, int64_t p0, float* const* out,
                           int64_t o0, int64_t nout) {
  typename V::T acc[kConvOutBlock][PV];
  for (int o = 0; o < kConvOutBlock; ++o) {
    const typename V::T init = a.bias && o < nout ? V::bcast(a.bias + o0 + o) : V::zero();
    for (int v = 0; v < PV; ++v) acc[o][v] = init;
  }
  if constexpr (kOne) {
    const float* x = a.in + a.off[0] + p0;
    for (int64_t c = 0; c < a.ci; ++c, x += a.in_plane, w += kConvOutBlock) {
      typename V::T xv[PV];
      for (int v = 0; v < PV; ++v) xv[v] = V::pin(V::load(x + v * V::L));
      for (int o = 0; o < kConvOutBlock; ++o) {
        const typename V::T wv = V::bcast(w + o);
        for (int v = 0; v < PV; ++v) acc[o][v] = V::fma(xv[v], wv, acc[o][v]);
      }
    }
  }
  for (int64_t c = 0; c < (kOne ? 0 : a.ci); ++c) {
    const float* x = a.in + c * a.in_plane + p0;
    const float* wc = w + c * a.taps * kConvOutBlock;
    for (int64_t s = 0; s < a.taps; ++s) {
      const float* xs = x + a.off[s];
      const float* ws = wc + s * kConvOutBlock;
      typename V::T xv[PV];
      for (int v = 0; v < PV; ++v) xv[v] = V::load(xs + v * V::L);
      for (int o = 0; o < kConvOutBlock; ++o) {
        const typename V::T wv = V::bcast(ws + o);
        for (int v = 0; v < PV; ++v) acc[o][v] = V::fma(xv[v], wv, acc[o][v]);
      }
    }
  }
  for (int64_t o = 0; o < nout; ++o)
    for (int v = 0; v < PV; ++v) V::store(out[o] + p0 + v * V::L, acc[o][v]);
}

template <class V, bool kOne>
void correlate_blocks(const CorrelateArgs& a) {
  constexpr int kMax = V::kCorrVecs;
  const int64_t nvec = a.npos / V::L;
  const int64_t blocks = (a.co + kConvOutBlock - 1) / kConvOutBlock;
  // Positions outer, output blocks inner: one tile's input rows stay in L1 while every block's
  // weights stream past them.
  for (int64_t v0 = 0; v0 < nvec; v0 += kMax) {
    const int64_t nv = nvec - v0 < kMax ? nvec - v0 : kMax;
    const int64_t p0 = v0 * V::L;
    for (int64_t ob = 0; ob < blocks; ++ob) {
      const int64_t o0 = ob * kConvOutBlock;
      const int64_t nout = a.co - o0 < kConvOutBlock ? a.co - o0 : kConvOutBlock;
      float* out[kConvOutBlock];
      for (int64_t o = 0; o < kConvOutBlock; ++o)
        out[o] = a.out + (o0 + (o < nout ? o : 0)) * a.out_plane;
      const float* w = a.wpk + ob * a.ci * a.taps * kConvOutBlock;
      switch (nv) {
        case 1:
          correlate_tile<V, 1, kOne>(a, w, p0, out, o0, nout);
          break;
        case 2:
          correlate_tile<V, (kMax >= 2 ? 2 : 1), kOne>(a, w, p0, out, o0, nout);
          break;
        case 3:
          correlate_tile<V, (kMax >= 3 ? 3 : 1), kOne>(a, w, p0, out, o0, nout);
          break;
        case 4:
          correlate_tile<V, (kMax >= 4 ? 4 : 1), kOne>(a, w, p0, out, o0, nout);
          break;
        case 5:
          correlate_tile<V, (kMax >= 5 ? 5 : 1), kOne>(a, w, p0, out, o0, nout);
          break;
        default:
          correlate_tile<V, (kMax >= 6 ? 6 : 1), kOne>(a, w, p0, out, o0, nout);
          break;
      }
    }
  }
}

template <class V>
void correlate_impl(const CorrelateArgs& a) {
  if (a.taps == 1)
    correlate_blocks<V, true>(a);
  else
    correlate_blocks<V, false>(a);
}

// NR kernel rows of KW taps each (rows: (c, i) pairs, or single taps when KW is 1) for the
// output channels [o, o + L): NR x KW accumulators, one vector load of gradients per output
// position and one broadcast per tap.
template <class V, int KW, int NR>
inline void weight_grad_tile(const WeightGradArgs& a, int64_t o, const int64_t* roff,
                             const int64_t* dst) {
  typename V::T acc[NR][KW];
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < KW; ++j) acc[r][j] = V::zero();
  const float* g = a.gt + o;
  for (int64_t b = 0; b < a.images; ++b) {
    const float* xb = a.x + b * a.x_image;
    for (int64_t y = 0; y < a.ho; ++y) {
      const float* xy = xb + y * a.wp;
      for (int64_t xo = 0; xo < a.wo; ++xo, g += a.co_stride) {
        const typename V::T gv = V::load(g);
        for (int r = 0; r < NR; ++r) {
          const float* xr = xy + roff[r] + xo;
          for (int j = 0; j < KW; ++j) acc[r][j] = V::fma(gv, V::bcast(xr + j), acc[r][j]);
        }
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < KW; ++j) V::store(a.dwt + (dst[r] + j) * a.co_stride + o, acc[r][j]);
}

// Rows of at most kRows at a time, NR dispatched at run time.
template <class V, int KW, int kRows>
inline void weight_grad_rows(const WeightGradArgs& a, int64_t o, const int64_t* roff,
                             const int64_t* dst, int64_t rows) {
  for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
    const int64_t nr = rows - r0 < kRows ? rows - r0 : kRows;
    const int64_t* ro = roff + r0;
    const int64_t* d = dst + r0;
    switch (nr) {
#define STARLING_WG_CASE(N)                                     \
  case N:                                                       \
    weight_grad_tile<V, KW, (N <= kRows ? N : 1)>(a, o, ro, d); \
    break;
      STARLING_WG_CASE(1)
      STARLING_WG_CASE(2)
      STARLING_WG_CASE(3)
      STARLING_WG_CASE(4)
      STARLING_WG_CASE(5)
      STARLING_WG_CASE(6)
      STARLING_WG_CASE(7)
      STARLING_WG_CASE(8)
      STARLING_WG_CASE(9)
#undef STARLING_WG_CASE
      default:
        break;
    }
  }
}

template <class V>
void weight_grad_impl(const WeightGradArgs& a) {
  // Kernel rows (3 or 5 taps wide, stride 1) or single taps, their input offsets and their first
  // output.
  constexpr int kMaxRows = 64;
  int64_t roff[kMaxRows], dst[kMaxRows];
  const int64_t st = a.stride;
  const bool rows3 = a.kw == 3 && st == 1, rows5 = a.kw == 5 && st == 1;
  const int64_t width = rows3 || rows5 ? a.kw : 1;
  for (int64_t c0 = a.c0; c0 < a.c1;) {
    int64_t n = 0, c = c0;
    for (; c < a.c1 && n + a.kh * (a.kw / width) <= kMaxRows; ++c)
      for (int64_t i = 0; i < a.kh; ++i)
        for (int64_t j = 0; j < a.kw; j += width) {
          roff[n] =
              c * a.x_plane + ((i % st) * st + j % st) * a.phase_plane + (i / st) * a.wp + j / st;
          dst[n++] = (c * a.kh + i) * a.kw + j;
        }
    for (int64_t o = a.o0; o < a.o0 + kConvQuantum; o += V::L) {
      if (rows3) {
        weight_grad_rows<V, 3, V::kGradRows3>(a, o, roff, dst, n);
      } else if (rows5) {
        weight_grad_rows<V, 5, V::kGradRows5>(a, o, roff, dst, n);
      } else {
        weight_grad_rows<V, 1, V::kGradTaps>(a, o, roff, dst, n);
      }
    }
    c0 = c;
  }
}

}  // namespace
}  // namespace starling::ops::internal
