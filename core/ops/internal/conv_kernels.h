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

// out[o][p] = bias[o] + sum over c < ci, s < taps of w[o][c][s] * in[c][p + off[s]], for
// o < co and p < npos (bias 0 where it is null). `in` must be readable (and zero where the image
// has no data) up to npos + max(off) in every channel.
// With unit_off, positions come in units of kConvQuantum floats: unit u (u < npos /
// kConvQuantum) reads in[c][unit_off[u] + off[s] + l] for l < kConvQuantum and writes
// out[o][u kConvQuantum + l]. The batch-in-lanes layout uses it: a position is kConvQuantum
// images side by side, and only kept outputs are listed.
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
  int64_t npos;                       // multiple of kConvQuantum
  const float* bias;                  // co values, or nullptr
  const int64_t* unit_off = nullptr;  // nullptr, or npos / kConvQuantum offsets
};

// The weight gradient in the batch-in-lanes layout: dw[o][e] = sum over units u and l <
// kConvQuantum of gy[o * gy_plane + gy_off[u] + l] * x[roff[e] + x_off[u] + l], for o in
// [o0, o1) and entries e < entries (an entry: an input channel and a tap, roff its offset),
// written to dw[o * dw_stride + dst[e]]. Sums run lane by lane in unit order, then over the
// lanes in a fixed order: the same bits however the caller splits outputs and entries over
// threads.
struct LaneGradArgs {
  const float* gy;
  const int64_t* gy_off;  // per unit
  const float* x;
  const int64_t* x_off;  // per unit
  int64_t units;
  const int64_t* roff;  // per entry
  const int64_t* dst;   // per entry
  int64_t entries;
  int64_t gy_plane;  // floats between output channels of gy
  int64_t o0, o1;
  float* dw;
  int64_t dw_stride;
};

// dst[j][i] = src[i][j] for i, j < kConvQuantum, for each of `blocks` blocks: src and dst hold
// blocks * kConvQuantum row pointers, each row kConvQuantum floats.
struct TransposeArgs {
  const float* const* src;
  float* const* dst;
  int64_t blocks;
};

// The weight gradient, transposed: dwt[c][i][j][o] = sum over images b and outputs (y, x) of
// gt[b][y][x][o] * x[b][c][(y + i) wp + x + j], written (not added) for c in [c0, c1) and o in
// [o0, o0 + kConvQuantum). At a stride s > 1 a channel holds s x s phase planes, phase_plane
// floats apart (phase (a, b): the padded image's rows s u + a and columns s v + b, wp wide),
// and tap (i, j) reads phase (i % s, j % s) at (y + i / s) wp + x + j / s. Vectors run over output
// channels, so no lane sums are needed and only real output positions are visited. The sum runs
// over images and positions in a fixed order: the same bits however the caller splits channels over
// threads.
struct WeightGradArgs {
  const float* gt;    // gt[((b * ho + y) * wo + x) * co_stride + o]
  int64_t co_stride;  // multiple of kConvQuantum; zero beyond the real output channels
  const float* x;     // x[b][c][q] at x + b * x_image + c * x_plane + q (flat padded layout)
  int64_t x_plane, x_image, wp;
  int64_t images, ho, wo;
  int64_t kh, kw;
  int64_t stride, phase_plane;
  int64_t o0;  // multiple of kConvQuantum
  int64_t c0, c1;
  float* dwt;  // dwt[((c * kh + i) * kw + j) * co_stride + o]
  // pad > 0: x is not padded (planes of h rows of wp floats) and reads outside them are zeros,
  // `pad` rows and columns each side; only at stride 1 with kw 3 or 5, and wp + 2 pad + kw <=
  // kWeightGradMaxRow.
  int64_t pad = 0, h = 0;
};

// The widest row weight_grad reads unpadded (WeightGradArgs::pad).
inline constexpr int64_t kWeightGradMaxRow = 2048;

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
void lane_weight_grad(const LaneGradArgs& a);
void transpose16(const TransposeArgs& a);

// Per instruction set, defined in core/ops/conv_kernels_*.cc.
void correlate_generic(const CorrelateArgs& a);
void weight_grad_generic(const WeightGradArgs& a);
void lane_weight_grad_generic(const LaneGradArgs& a);
void transpose16_generic(const TransposeArgs& a);
#if defined(__x86_64__)
void correlate_avx2(const CorrelateArgs& a);
void weight_grad_avx2(const WeightGradArgs& a);
void lane_weight_grad_avx2(const LaneGradArgs& a);
void transpose16_avx2(const TransposeArgs& a);
void correlate_avx512(const CorrelateArgs& a);
void weight_grad_avx512(const WeightGradArgs& a);
void lane_weight_grad_avx512(const LaneGradArgs& a);
void transpose16_avx512(const TransposeArgs& a);
#endif

}  // namespace starling::ops::internal
