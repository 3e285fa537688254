// The bodies of the direct convolution kernels (conv_kernels.h), written once over a vector
// policy V and included by one translation unit per instruction set, each compiled with its own
// target flags. Everything here lives in that unit's anonymous namespace and calls nothing from
// the standard library, so no code compiled for one instruction set can be linked in place of
// another's (no shared inline or template instantiations).
//
// V provides: type T, lane count L (divides kConvQuantum), load / store (unaligned), bcast
// (a float from memory into every lane), fma(a, b, c) = a * b + c, zero(), hsum (sum of the
// lanes, in a fixed order); and register budgets: kCorrVecs (position vectors per output block
// in `correlate`'s register tile) and kGradOuts (output channels per `weight_grad` tile).
#pragma once

#include <cstdint>

#include "core/ops/internal/conv_kernels.h"

namespace starling::ops::internal {
namespace {

// Taps per weight_grad tile: 9 covers a 3x3 kernel in one pass; 5x5 takes 9 + 9 + 7.
constexpr int kGradTaps = 9;

// One register tile: kConvOutBlock output channels x PV vectors of positions from p0.
template <class V, int PV>
inline void correlate_tile(const CorrelateArgs& a, const float* w, int64_t p0, float* const* out,
                           int64_t nout) {
  typename V::T acc[kConvOutBlock][PV];
  for (int o = 0; o < kConvOutBlock; ++o)
    for (int v = 0; v < PV; ++v) acc[o][v] = V::zero();
  for (int64_t c = 0; c < a.ci; ++c) {
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

template <class V>
void correlate_impl(const CorrelateArgs& a) {
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
          correlate_tile<V, 1>(a, w, p0, out, nout);
          break;
        case 2:
          correlate_tile<V, (kMax >= 2 ? 2 : 1)>(a, w, p0, out, nout);
          break;
        case 3:
          correlate_tile<V, (kMax >= 3 ? 3 : 1)>(a, w, p0, out, nout);
          break;
        case 4:
          correlate_tile<V, (kMax >= 4 ? 4 : 1)>(a, w, p0, out, nout);
          break;
        case 5:
          correlate_tile<V, (kMax >= 5 ? 5 : 1)>(a, w, p0, out, nout);
          break;
        default:
          correlate_tile<V, (kMax >= 6 ? 6 : 1)>(a, w, p0, out, nout);
          break;
      }
    }
  }
}

// dw for NO output channels from o and NT taps from s0, input channel c.
template <class V, int NO, int NT>
inline void weight_grad_tile(const WeightGradArgs& a, int64_t o, int64_t c, int64_t s0) {
  typename V::T acc[NO][NT];
  for (int k = 0; k < NO; ++k)
    for (int t = 0; t < NT; ++t) acc[k][t] = V::zero();
  int64_t off[NT];
  for (int t = 0; t < NT; ++t) off[t] = a.off[s0 + t];
  for (int64_t b = 0; b < a.images; ++b) {
    const float* dy = a.dy + b * a.dy_image + o * a.dy_plane;
    const float* x = a.x + b * a.x_image + c * a.x_plane;
    for (int64_t p = 0; p < a.npos; p += V::L) {
      typename V::T g[NO];
      for (int k = 0; k < NO; ++k) g[k] = V::load(dy + k * a.dy_plane + p);
      for (int t = 0; t < NT; ++t) {
        const typename V::T xv = V::load(x + p + off[t]);
        for (int k = 0; k < NO; ++k) acc[k][t] = V::fma(g[k], xv, acc[k][t]);
      }
    }
  }
  for (int k = 0; k < NO; ++k)
    for (int t = 0; t < NT; ++t) a.dw[((o + k) * a.ci + c) * a.taps + s0 + t] = V::hsum(acc[k][t]);
}

template <class V, int NO>
inline void weight_grad_taps(const WeightGradArgs& a, int64_t o, int64_t c) {
  for (int64_t s0 = 0; s0 < a.taps; s0 += kGradTaps) {
    switch (a.taps - s0 < kGradTaps ? a.taps - s0 : kGradTaps) {
      case 1:
        weight_grad_tile<V, NO, 1>(a, o, c, s0);
        break;
      case 2:
        weight_grad_tile<V, NO, 2>(a, o, c, s0);
        break;
      case 3:
        weight_grad_tile<V, NO, 3>(a, o, c, s0);
        break;
      case 4:
        weight_grad_tile<V, NO, 4>(a, o, c, s0);
        break;
      case 5:
        weight_grad_tile<V, NO, 5>(a, o, c, s0);
        break;
      case 6:
        weight_grad_tile<V, NO, 6>(a, o, c, s0);
        break;
      case 7:
        weight_grad_tile<V, NO, 7>(a, o, c, s0);
        break;
      case 8:
        weight_grad_tile<V, NO, 8>(a, o, c, s0);
        break;
      default:
        weight_grad_tile<V, NO, 9>(a, o, c, s0);
        break;
    }
  }
}

template <class V>
void weight_grad_impl(const WeightGradArgs& a) {
  constexpr int kNo = V::kGradOuts;
  for (int64_t o = a.o0; o < a.o1;) {
    const bool full = a.o1 - o >= kNo;
    for (int64_t c = a.c0; c < a.c1; ++c) {
      if (full) {
        weight_grad_taps<V, kNo>(a, o, c);
      } else {
        weight_grad_taps<V, 1>(a, o, c);
      }
    }
    o += full ? kNo : 1;
  }
}

}  // namespace
}  // namespace starling::ops::internal
