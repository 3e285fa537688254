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
// `weight_grad`'s tiles, kGradRows3 / kGradRows5 (rows of a 3- or 5-wide kernel: 2 KW - 1
// registers each, KW sums and a window of KW - 1 inputs) and kGradTaps (single taps), each at
// most 9; kLaneGradOut x kLaneGradEntries, `lane_weight_grad`'s tile
// (with one more vector per output and one for the input, it fits the register file).
#pragma once

#include <cstdint>

#include "core/ops/internal/conv_kernels.h"

// The 16-float GCC vectors of transpose16 never leave this unit's anonymous namespace: the psABI
// note on passing them by value (on units built without AVX-512) does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace starling::ops::internal {
namespace {

// One register tile: kConvOutBlock output channels x PV vectors of positions from p0. kOne: a
// single tap (1x1 products), its loop gone. kUnits: vector v reads from its unit's offset
// (CorrelateArgs::unit_off) instead of p0 + v L.
template <class V, int PV, bool kOne, bool kUnits>
inline void correlate_tile(const CorrelateArgs& a, const float* w, int64_t p0, float* const* out,
                           int64_t o0, int64_t nout) {
  int64_t vo[PV];
  for (int v = 0; v < PV; ++v) {
    if constexpr (kUnits) {
      constexpr int64_t kPer = kConvQuantum / V::L;
      const int64_t vi = p0 / V::L + v;
      vo[v] = a.unit_off[vi / kPer] + vi % kPer * V::L;
    } else {
      vo[v] = p0 + v * V::L;
    }
  }
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
    const float* x = a.in + c * a.in_plane + (kUnits ? 0 : p0);
    const float* wc = w + c * a.taps * kConvOutBlock;
    for (int64_t s = 0; s < a.taps; ++s) {
      const float* xs = x + a.off[s];
      const float* ws = wc + s * kConvOutBlock;
      typename V::T xv[PV];
      for (int v = 0; v < PV; ++v) xv[v] = V::load(xs + (kUnits ? vo[v] : v * V::L));
      for (int o = 0; o < kConvOutBlock; ++o) {
        const typename V::T wv = V::bcast(ws + o);
        for (int v = 0; v < PV; ++v) acc[o][v] = V::fma(xv[v], wv, acc[o][v]);
      }
    }
  }
  for (int64_t o = 0; o < nout; ++o)
    for (int v = 0; v < PV; ++v) V::store(out[o] + p0 + v * V::L, acc[o][v]);
}

template <class V, bool kOne, bool kUnits>
void correlate_blocks(const CorrelateArgs& a) {
  constexpr int kMax = V::kCorrVecs;
  const int64_t nvec = a.npos / V::L;
  const int64_t blocks = (a.co + kConvOutBlock - 1) / kConvOutBlock;
  // Positions outer, output blocks inner: one tile's input rows stay in L1 while every block's
  // weights stream past them. The fewest tiles of at most kMax vectors, of near-equal sizes (14
  // vectors: 4, 5, 5, not 6, 6, 2: a narrow tile has too few sums in flight to hide the
  // multiply-add's latency).
  const int64_t ntiles = (nvec + kMax - 1) / kMax;
  for (int64_t t = 0; t < ntiles; ++t) {
    const int64_t v0 = nvec * t / ntiles, nv = nvec * (t + 1) / ntiles - v0;
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
          correlate_tile<V, 1, kOne, kUnits>(a, w, p0, out, o0, nout);
          break;
        case 2:
          correlate_tile<V, (kMax >= 2 ? 2 : 1), kOne, kUnits>(a, w, p0, out, o0, nout);
          break;
        case 3:
          correlate_tile<V, (kMax >= 3 ? 3 : 1), kOne, kUnits>(a, w, p0, out, o0, nout);
          break;
        case 4:
          correlate_tile<V, (kMax >= 4 ? 4 : 1), kOne, kUnits>(a, w, p0, out, o0, nout);
          break;
        case 5:
          correlate_tile<V, (kMax >= 5 ? 5 : 1), kOne, kUnits>(a, w, p0, out, o0, nout);
          break;
        default:
          correlate_tile<V, (kMax >= 6 ? 6 : 1), kOne, kUnits>(a, w, p0, out, o0, nout);
          break;
      }
    }
  }
}

template <class V>
void correlate_impl(const CorrelateArgs& a) {
  if (a.unit_off)
    correlate_blocks<V, false, true>(a);
  else if (a.taps == 1)
    correlate_blocks<V, true, false>(a);
  else
    correlate_blocks<V, false, false>(a);
}

// Zeros for the rows outside an unpadded image (WeightGradArgs::pad).
alignas(64) constexpr float kZeroRow[kWeightGradMaxRow] = {};

// NR kernel rows of KW taps each (rows: (c, i) pairs, rrow their kernel rows i, or single taps
// when KW is 1) for the output channels [o, o + L): NR x KW accumulators, one vector load of
// gradients per output position and one broadcast per input value.
template <class V, int KW, int NR>
inline void weight_grad_tile(const WeightGradArgs& a, int64_t o, const int64_t* roff,
                             const int64_t* rrow, const int64_t* dst) {
  typename V::T acc[NR][KW];
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < KW; ++j) acc[r][j] = V::zero();
  const float* g = a.gt + o;
  if constexpr (KW > 1) {
    // A window over each row: output xo needs x[xo .. xo + KW - 1], and the next one shares
    // KW - 1 of them, so each x value is broadcast once, not KW times (the kernel was bound by
    // its loads: 28 per 27 multiply-adds at 3x3; now NR + 1 per KW NR). Unpadded (a.pad > 0),
    // padded column xo + j is the row's column xo + j - pad: the window starts with the left
    // padding's zeros, the last outputs take the right padding's, and rows outside the image
    // read kZeroRow.
    const int64_t pad = a.pad;
    // Outputs whose last tap lies inside the row.
    const int64_t xend =
        pad > 0 ? (a.wo < a.wp - (KW - 1) + pad ? a.wo : a.wp - (KW - 1) + pad) : a.wo;
    for (int64_t b = 0; b < a.images; ++b) {
      const float* xb = a.x + b * a.x_image;
      for (int64_t y = 0; y < a.ho; ++y) {
        const float* xr[NR];
        typename V::T win[NR][KW - 1];
        for (int r = 0; r < NR; ++r) {
          if (pad > 0) {
            // Column c of padded row y + i is xr[r][c]; its first `pad` columns are zeros.
            const int64_t yy = y + rrow[r] - pad;
            xr[r] = (yy >= 0 && yy < a.h ? xb + roff[r] + yy * a.wp : kZeroRow + pad) - pad;
            for (int j = 0; j < KW - 1; ++j)
              win[r][j] = j < pad || j - pad >= a.wp ? V::zero() : V::bcast(xr[r] + j);
          } else {
            xr[r] = xb + y * a.wp + roff[r];
            for (int j = 0; j < KW - 1; ++j) win[r][j] = V::bcast(xr[r] + j);
          }
        }
        for (int64_t xo = 0; xo < a.wo; ++xo, g += a.co_stride) {
          const typename V::T gv = V::load(g);
          const bool inside = xo < xend;
          for (int r = 0; r < NR; ++r) {
            const typename V::T last = inside ? V::bcast(xr[r] + xo + KW - 1) : V::zero();
            for (int j = 0; j < KW - 1; ++j) acc[r][j] = V::fma(gv, win[r][j], acc[r][j]);
            acc[r][KW - 1] = V::fma(gv, last, acc[r][KW - 1]);
            for (int j = 0; j + 1 < KW - 1; ++j) win[r][j] = win[r][j + 1];
            win[r][KW - 2] = last;
          }
        }
      }
    }
  }
  // Where rows are as wide as the output (1x1, no padding), an image is one run of positions.
  const bool one_run = a.wp == a.wo;
  const int64_t ny = one_run ? 1 : a.ho, nx = one_run ? a.ho * a.wo : a.wo;
  for (int64_t b = 0; b < (KW > 1 ? 0 : a.images); ++b) {
    const float* xb = a.x + b * a.x_image;
    for (int64_t y = 0; y < ny; ++y) {
      const float* xy = xb + y * a.wp;
      for (int64_t xo = 0; xo < nx; ++xo, g += a.co_stride) {
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

// Rows in the fewest tiles of at most kRows, of near-equal sizes (48 rows: six of 8, not five
// of 9 and one of 3), NR dispatched at run time.
template <class V, int KW, int kRows>
inline void weight_grad_rows(const WeightGradArgs& a, int64_t o, const int64_t* roff,
                             const int64_t* rrow, const int64_t* dst, int64_t rows) {
  const int64_t ntiles = (rows + kRows - 1) / kRows;
  for (int64_t t = 0; t < ntiles; ++t) {
    const int64_t r0 = rows * t / ntiles, nr = rows * (t + 1) / ntiles - r0;
    const int64_t* ro = roff + r0;
    const int64_t* ri = rrow + r0;
    const int64_t* d = dst + r0;
    switch (nr) {
#define STARLING_WG_CASE(N)                                         \
  case N:                                                           \
    weight_grad_tile<V, KW, (N <= kRows ? N : 1)>(a, o, ro, ri, d); \
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
  int64_t roff[kMaxRows], rrow[kMaxRows], dst[kMaxRows];
  const int64_t st = a.stride;
  const bool rows3 = a.kw == 3 && st == 1, rows5 = a.kw == 5 && st == 1;
  const int64_t width = rows3 || rows5 ? a.kw : 1;
  for (int64_t c0 = a.c0; c0 < a.c1;) {
    int64_t n = 0, c = c0;
    for (; c < a.c1 && n + a.kh * (a.kw / width) <= kMaxRows; ++c)
      for (int64_t i = 0; i < a.kh; ++i)
        for (int64_t j = 0; j < a.kw; j += width) {
          // Unpadded, a row's offset is its channel's; its kernel row picks the input row.
          roff[n] = a.pad > 0 ? c * a.x_plane
                              : c * a.x_plane + ((i % st) * st + j % st) * a.phase_plane +
                                    (i / st) * a.wp + j / st;
          rrow[n] = i;
          dst[n++] = (c * a.kh + i) * a.kw + j;
        }
    for (int64_t o = a.o0; o < a.o0 + kConvQuantum; o += V::L) {
      if (rows3) {
        weight_grad_rows<V, 3, V::kGradRows3>(a, o, roff, rrow, dst, n);
      } else if (rows5) {
        weight_grad_rows<V, 5, V::kGradRows5>(a, o, roff, rrow, dst, n);
      } else {
        weight_grad_rows<V, 1, V::kGradTaps>(a, o, roff, rrow, dst, n);
      }
    }
    c0 = c;
  }
}

// NO output channels from o x NE entries over units [u0, u1): one vector load of gy per output
// and one of x per entry for NO x NE multiply-adds, continuing the partial sums in part
// (part[n kLaneGradEntries + e]).
template <class V, int NO, int NE>
inline void lane_grad_tile(const LaneGradArgs& a, int64_t o, const int64_t* roff, int64_t u0,
                           int64_t u1, typename V::T* part) {
  constexpr int64_t kPer = kConvQuantum / V::L;
  constexpr int kE = V::kLaneGradEntries;
  typename V::T acc[NO][NE];
  for (int n = 0; n < NO; ++n)
    for (int e = 0; e < NE; ++e) acc[n][e] = part[n * kE + e];
  const float* gy = a.gy + o * a.gy_plane;
  for (int64_t u = u0; u < u1; ++u) {
    const float* g = gy + a.gy_off[u];
    const float* x = a.x + a.x_off[u];
    for (int64_t k = 0; k < kPer; ++k, g += V::L, x += V::L) {
      typename V::T gv[NO];
      for (int n = 0; n < NO; ++n) gv[n] = V::pin(V::load(g + n * a.gy_plane));
      for (int e = 0; e < NE; ++e) {
        const typename V::T xv = V::pin(V::load(x + roff[e]));
        for (int n = 0; n < NO; ++n) acc[n][e] = V::fma(gv[n], xv, acc[n][e]);
      }
    }
  }
  for (int n = 0; n < NO; ++n)
    for (int e = 0; e < NE; ++e) part[n * kE + e] = acc[n][e];
}

template <class V, int NO>
inline void lane_grad_entries(const LaneGradArgs& a, int64_t o, const int64_t* roff, int64_t ne,
                              int64_t u0, int64_t u1, typename V::T* part) {
  constexpr int kE = V::kLaneGradEntries;
  switch (ne) {
#define STARLING_LG_CASE(N)                                             \
  case N:                                                               \
    lane_grad_tile<V, NO, (N <= kE ? N : 1)>(a, o, roff, u0, u1, part); \
    break;
    STARLING_LG_CASE(1)
    STARLING_LG_CASE(2)
    STARLING_LG_CASE(3)
    STARLING_LG_CASE(4)
    STARLING_LG_CASE(5)
    STARLING_LG_CASE(6)
#undef STARLING_LG_CASE
    default:
      break;
  }
}

// Outputs kLaneGradOut at a time, entries kSpan at a time, units kChunk at a time: a chunk's
// gradients and inputs (about 32 KB) stay in L1 while every tile of the span passes over them,
// each tile's sums kept in `part` between chunks (the same order of additions as one pass).
template <class V>
void lane_weight_grad_impl(const LaneGradArgs& a) {
  constexpr int kO = V::kLaneGradOut, kE = V::kLaneGradEntries;
  static_assert(kO <= 4 && kE <= 6, "lane_grad dispatches up to 4 x 6");
  constexpr int64_t kChunk = 64, kSpan = 18, kTiles = (kSpan + kE - 1) / kE;
  typename V::T part[kTiles][kO * kE];
  for (int64_t o = a.o0; o < a.o1; o += kO) {
    const int64_t no = a.o1 - o < kO ? a.o1 - o : kO;
    for (int64_t es = 0; es < a.entries; es += kSpan) {
      const int64_t span = a.entries - es < kSpan ? a.entries - es : kSpan;
      for (int64_t t = 0; t < kTiles; ++t)
        for (int i = 0; i < kO * kE; ++i) part[t][i] = V::zero();
      for (int64_t u0 = 0; u0 < a.units; u0 += kChunk) {
        const int64_t u1 = a.units - u0 < kChunk ? a.units : u0 + kChunk;
        for (int64_t t = 0; t * kE < span; ++t) {
          const int64_t e = es + t * kE, ne = span - t * kE < kE ? span - t * kE : kE;
          switch (no) {
            case 1:
              lane_grad_entries<V, 1>(a, o, a.roff + e, ne, u0, u1, part[t]);
              break;
            case 2:
              lane_grad_entries<V, (kO >= 2 ? 2 : 1)>(a, o, a.roff + e, ne, u0, u1, part[t]);
              break;
            case 3:
              lane_grad_entries<V, (kO >= 3 ? 3 : 1)>(a, o, a.roff + e, ne, u0, u1, part[t]);
              break;
            default:
              lane_grad_entries<V, (kO >= 4 ? 4 : 1)>(a, o, a.roff + e, ne, u0, u1, part[t]);
              break;
          }
        }
      }
      for (int64_t t = 0; t * kE < span; ++t)
        for (int64_t n = 0; n < no; ++n)
          for (int64_t e = 0; e < kE && t * kE + e < span; ++e)
            a.dw[(o + n) * a.dw_stride + a.dst[es + t * kE + e]] = V::hsum(part[t][n * kE + e]);
    }
  }
}

// 16 x 16 transposes on GCC vectors of 16 floats: four rounds, each swapping the off-diagonal
// k x k blocks of every 2k x 2k block (k = 8, 4, 2, 1) with two-source shuffles.
typedef float F16 __attribute__((vector_size(64)));
typedef int I16 __attribute__((vector_size(64)));
static_assert(kConvQuantum == 16, "transpose16 moves blocks of 16 x 16");

template <int K>
inline void transpose_round(F16* r) {
  // lo[j] = j where bit K of j is clear, else b[j - K]; hi[j] = a[j + K] or b[j].
  constexpr I16 lo = K == 8   ? I16{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}
                     : K == 4 ? I16{0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27}
                     : K == 2 ? I16{0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29}
                              : I16{0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30};
  constexpr I16 hi = K == 8   ? I16{8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}
                     : K == 4 ? I16{4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31}
                     : K == 2 ? I16{2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31}
                              : I16{1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31};
  for (int i = 0; i < 16; ++i) {
    if (i & K) continue;
    const F16 x = r[i], y = r[i + K];
    r[i] = __builtin_shuffle(x, y, lo);
    r[i + K] = __builtin_shuffle(x, y, hi);
  }
}

template <class V>
void transpose16_impl(const TransposeArgs& a) {
  for (int64_t blk = 0; blk < a.blocks; ++blk) {
    const float* const* src = a.src + blk * 16;
    float* const* dst = a.dst + blk * 16;
    F16 r[16];
    for (int i = 0; i < 16; ++i) __builtin_memcpy(&r[i], src[i], sizeof(F16));
    transpose_round<8>(r);
    transpose_round<4>(r);
    transpose_round<2>(r);
    transpose_round<1>(r);
    for (int j = 0; j < 16; ++j) __builtin_memcpy(dst[j], &r[j], sizeof(F16));
  }
}

}  // namespace
}  // namespace starling::ops::internal
