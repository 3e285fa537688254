// Direct float32 convolution kernels for the CPU (stride 1), vectorized per instruction set and
// chosen at run time: AVX-512, AVX2 + FMA, or portable GCC vectors (NEON on arm64, SSE on other
// x86). They work on the "flattened padded" layout: an image's padded plane (Hp x Wp) is one
// row of Hp Wp floats, so output position p = y Wp + x needs input p + i Wp + j for tap (i, j)
// and one vector of 16 consecutive positions is a vector load per tap, with no im2col matrix.
// Positions whose x lies in the padding columns are computed and thrown away by the caller.
#pragma once

#include <cstdint>

namespace starling::ops::internal {

// Positions and plane lengths are multiples of this (every instruction set's lane count
// divides it), so the same buffers serve each kernel.
inline constexpr int64_t kConvQuantum = 16;
// Output channels computed together by `correlate`: packed weights come in blocks of this.
inline constexpr int64_t kConvOutBlock = 4;

// out[o][p] = sum over c < ci, s < taps of w[o][c][s] * in[c][p + off[s]], for o < co and
// p < npos. `in` must be readable (and zero where the image has no data) up to
// npos + max(off) in every channel.
struct CorrelateArgs {
  const float* in;  // channel c at in + c * in_plane
  int64_t in_plane;
  int64_t ci;
  const int64_t* off;  // tap offsets, each >= 0
  int64_t taps;
  const float* wpk;  // packed weights: [co / kConvOutBlock rounded up][ci][taps][kConvOutBlock]
  int64_t co;
  float* out;  // out[o * out_plane + p]
  int64_t out_plane;
  int64_t npos;  // multiple of kConvQuantum
};

// dw[o][c][s] = sum over images b, p < npos of dy[b][o][p] * x[b][c][p + off[s]], written (not
// added) for o in [o0, o1), c in [c0, c1). dy must be zero at positions that are not outputs.
// The sum runs over images and positions in a fixed order, so a given instruction set gives
// the same bits however the caller splits the (o, c) ranges over threads.
struct WeightGradArgs {
  const float* dy;  // dy[b][o][p] at dy + b * dy_image + o * dy_plane + p
  int64_t dy_plane, dy_image;
  const float* x;  // x[b][c][q] at x + b * x_image + c * x_plane + q
  int64_t x_plane, x_image;
  int64_t images;
  int64_t npos;  // multiple of kConvQuantum
  const int64_t* off;
  int64_t taps;
  int64_t ci;  // dw's channel count (row length ci * taps)
  int64_t o0, o1, c0, c1;
  float* dw;  // dw[(o * ci + c) * taps + s]
};

enum class ConvIsa { kGeneric, kAvx2, kAvx512 };

// The instruction set the kernels use: the best this CPU has, unless a test forced one.
ConvIsa conv_isa();
const char* conv_isa_name(ConvIsa isa);
// Whether this CPU (and this build) can run `isa`.
bool conv_isa_supported(ConvIsa isa);
// Tests: run every later call on `isa` (must be supported); returns the previous choice.
ConvIsa force_conv_isa(ConvIsa isa);

void correlate(const CorrelateArgs& a);
void weight_grad(const WeightGradArgs& a);

// Per instruction set, defined in core/ops/conv_kernels_*.cc.
void correlate_generic(const CorrelateArgs& a);
void weight_grad_generic(const WeightGradArgs& a);
#if defined(__x86_64__)
void correlate_avx2(const CorrelateArgs& a);
void weight_grad_avx2(const WeightGradArgs& a);
void correlate_avx512(const CorrelateArgs& a);
void weight_grad_avx512(const WeightGradArgs& a);
#endif

}  // namespace starling::ops::internal
