// CPU conv2d. Float32 convolutions (padding below the kernel's size) run the direct kernels of
// internal/conv_kernels.h: the forward pass and the input gradient are correlations (the latter
// with the kernel flipped and transposed) over zero-padded copies of the images, the weight
// gradient a sum of shifted products, and none of them builds a column matrix. A strided
// convolution splits the padded image into phases, one stride-1 correlation each; a 1x1
// convolution without padding reads and writes the tensors as they are. Batches of 16 images
// or more on small planes (and strided convolutions) put the images in the vector lanes
// instead, where the flattened planes would compute too many padding columns (lanes_path). Float64
// (and padding of a kernel's size or more) unfolds images (im2col) a chunk of the batch at a time
// into a (C_in kH kW, n H_out W_out) matrix, so one GEMM with the (C_out, C_in kH kW) weight serves
// the whole chunk; its backward pass recomputes the columns instead of keeping them; the float64
// finite-difference checks cover it.
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "core/autograd/autograd.h"
#include "core/ops/conv.h"
#include "core/ops/device_ops.h"
#include "core/ops/internal/conv_kernels.h"
#include "core/ops/internal/op_util.h"
#include "core/ops/matmul.h"

namespace starling::ops {

namespace {

using internal::dispatch_float;
using internal::gemm;

// Largest im2col buffer (elements) of one chunk; a single image may exceed it.
constexpr int64_t kColBudget = int64_t{1} << 20;

struct ConvGeom {
  int64_t b, ci, h, w, co, kh, kw, stride, pad, ho, wo;
  int64_t krows() const { return ci * kh * kw; }
  int64_t hw_out() const { return ho * wo; }
  int64_t chunk() const {
    return std::clamp<int64_t>(kColBudget / std::max<int64_t>(krows() * hw_out(), 1), 1, b);
  }
};

// Output columns [lo, hi) whose input column ox * stride - pad + j lies inside [0, w).
struct ColRange {
  int64_t lo, hi;
};
inline ColRange valid_cols(const ConvGeom& g, int64_t j) {
  const int64_t off = g.pad - j;  // input column = ox * stride - off
  const int64_t lo = off > 0 ? (off + g.stride - 1) / g.stride : 0;
  const int64_t last = g.w - 1 + off;  // ox * stride <= last
  const int64_t hi = last < 0 ? 0 : std::min(g.wo, last / g.stride + 1);
  return {std::min(lo, hi), hi};
}

// col (ci kh kw, n ho wo) from images [n0, n0 + n) of x (B, ci, h, w).
template <typename T>
void im2col(const ConvGeom& g, const T* x, int64_t n0, int64_t n, T* col) {
  const int64_t cols = n * g.hw_out();
#pragma omp parallel for collapse(2) if (g.krows() * cols > (1 << 15))
  for (int64_t r = 0; r < g.krows(); ++r) {
    for (int64_t img = 0; img < n; ++img) {
      const int64_t c = r / (g.kh * g.kw), i = (r / g.kw) % g.kh, j = r % g.kw;
      const T* plane = x + ((n0 + img) * g.ci + c) * g.h * g.w;
      T* dst = col + r * cols + img * g.hw_out();
      const ColRange cr = valid_cols(g, j);
      for (int64_t oy = 0; oy < g.ho; ++oy) {
        const int64_t y = oy * g.stride - g.pad + i;
        T* drow = dst + oy * g.wo;
        if (y < 0 || y >= g.h) {
          std::fill(drow, drow + g.wo, T(0));
          continue;
        }
        std::fill(drow, drow + cr.lo, T(0));
        std::fill(drow + cr.hi, drow + g.wo, T(0));
        const T* srow = plane + y * g.w;
        const int64_t shift = j - g.pad;  // input column = ox * stride + shift
        if (g.stride == 1) {
          std::copy(srow + cr.lo + shift, srow + cr.hi + shift, drow + cr.lo);
        } else {
          for (int64_t ox = cr.lo; ox < cr.hi; ++ox) drow[ox] = srow[ox * g.stride + shift];
        }
      }
    }
  }
}

// gx[n0 + img] += fold(col): the adjoint of im2col. Each (image, channel) plane is written by
// one thread only.
template <typename T>
void col2im_add(const ConvGeom& g, const T* col, int64_t n0, int64_t n, T* gx) {
  const int64_t cols = n * g.hw_out();
#pragma omp parallel for collapse(2) if (g.krows() * cols > (1 << 15))
  for (int64_t img = 0; img < n; ++img) {
    for (int64_t c = 0; c < g.ci; ++c) {
      T* plane = gx + ((n0 + img) * g.ci + c) * g.h * g.w;
      for (int64_t i = 0; i < g.kh; ++i) {
        for (int64_t j = 0; j < g.kw; ++j) {
          const T* src = col + ((c * g.kh + i) * g.kw + j) * cols + img * g.hw_out();
          const ColRange cr = valid_cols(g, j);
          for (int64_t oy = 0; oy < g.ho; ++oy) {
            const int64_t y = oy * g.stride - g.pad + i;
            if (y < 0 || y >= g.h) continue;
            T* prow = plane + y * g.w;
            const T* srow = src + oy * g.wo;
            const int64_t shift = j - g.pad;
            for (int64_t ox = cr.lo; ox < cr.hi; ++ox) prow[ox * g.stride + shift] += srow[ox];
          }
        }
      }
    }
  }
}

// A scratch buffer of at least `n` elements, kept per thread and slot across calls: the GEMM
// operands of one chunk are written whole before they are read, so reusing them saves the
// allocation, zero fill and page faults of every call (a training step convolves each layer
// twice or three times). Holds the largest chunk seen on this thread, kColBudget-bounded.
template <typename T>
T* scratch(size_t slot, int64_t n) {
  thread_local std::array<std::vector<T>, 4> buffers;
  std::vector<T>& b = buffers[slot];
  if (b.size() < static_cast<size_t>(n)) b.resize(static_cast<size_t>(n));
  return b.data();
}

// ---- The direct float32 path ----

using internal::kConvOutBlock;
using internal::kConvQuantum;

inline int64_t round_quantum(int64_t n) {
  return (n + kConvQuantum - 1) / kConvQuantum * kConvQuantum;
}

// A channel's planes in one buffer: h x w data at row `top`, column `left` of rows `wp` floats
// wide, zeros everywhere else up to `plane` floats.
struct PadSpec {
  int64_t h, w, top, left, wp, plane;
};

// Short runs of an image row (7 to 30 floats here): a memmove or memset call per row, or a
// vector loop with a scalar tail, cost more than the copy. Rows are copied in whole blocks of
// 16 floats where the block stays inside both buffers: what lands past the row's end is
// overwritten later, because rows, their padding and the next planes are written in address
// order.
constexpr int64_t kBlock = 16;

inline void copy_run(const float* s, int64_t n, float* d, const float* s_end, const float* d_end) {
  const int64_t whole = (n + kBlock - 1) / kBlock * kBlock;
  if (s + whole <= s_end && d + whole <= d_end) {
    for (int64_t i = 0; i < whole; i += kBlock) std::memcpy(d + i, s + i, kBlock * sizeof(float));
    return;
  }
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) d[i] = s[i];
}

inline void zero_run(float* d, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) d[i] = 0.0f;
}

// A short run of zeros (a row's padding: 2 floats here) as one block store where the block
// stays inside the buffer, like copy_run: GCC turns zero_run's loop into a memset call, which
// costs more than the store.
inline void zero_short(float* d, int64_t n, const float* d_end) {
  static constexpr float kZeros[kBlock] = {};
  if (n <= kBlock && d + kBlock <= d_end) {
    std::memcpy(d, kZeros, sizeof kZeros);
    return;
  }
  zero_run(d, n);
}

// dst (channels x p.plane): the channels' h x w planes of src, zero-padded.
void pad_planes(const PadSpec& p, const float* src, int64_t channels, float* dst) {
  const float* s_end = src + channels * p.h * p.w;
  const float* d_end = dst + channels * p.plane;
  for (int64_t c = 0; c < channels; ++c) {
    const float* s = src + c * p.h * p.w;
    float* d = dst + c * p.plane;
    zero_short(d, p.top * p.wp + p.left, d_end);
    for (int64_t y = 0; y < p.h; ++y) {
      float* row = d + (y + p.top) * p.wp + p.left;
      copy_run(s + y * p.w, p.w, row, s_end, d_end);
      // This row's right padding and the next row's left padding.
      zero_short(row + p.w, p.wp - p.w, d_end);
    }
    const int64_t tail = (p.h + p.top) * p.wp + p.left;
    zero_run(d + tail, p.plane - tail);
  }
}

// The flattened padded layout of one correlation at stride s. The image with ph rows and pw
// columns of zeros each side is hp x (w + 2 pw). At stride 1 a channel is that plane with rows
// wp = w + pw apart, stored `plane` floats apart: a row's pw trailing zeros are also the next
// row's leading ones (a tap reaches at most pw columns past either edge of a kept output's row),
// and output position p = y wp + x reads tap (i, j) at p + i wp + j. At s > 1 the
// padded image is split into s x s phase planes of hq x wq (phase (a, b): rows s u + a, columns
// s v + b), `phase` floats apart, so tap (i, j) reads phase (i % s, j % s) at
// p + (i / s) wq + j / s with p = y wq + x: a strided convolution is a sum of stride-1 ones and
// visits only the outputs it keeps. Outputs are computed for p < npos.
struct Flat {
  int64_t h, w, ph, pw, s, hp, wp, ho, wo, hq, wq, npos, phase, plane;
  std::vector<int64_t> off;  // per tap
  PadSpec pad() const { return {h, w, ph, pw, wp, plane}; }
};

Flat flat_of(int64_t h, int64_t w, int64_t ph, int64_t pw, int64_t kh, int64_t kw, int64_t s = 1) {
  Flat f{h, w, ph, pw, s, h + 2 * ph, w + pw, 0, 0, 0, 0, 0, 0, 0, {}};
  f.ho = (f.hp - kh) / s + 1;
  f.wo = (w + 2 * pw - kw) / s + 1;
  f.hq = f.ho + (kh - 1) / s;  // hp at stride 1
  f.wq = s == 1 ? f.wp : f.wo + (kw - 1) / s;
  f.npos = round_quantum((f.ho - 1) * f.wq + f.wo);
  const int64_t max_off = (kh - 1) / s * f.wq + (kw - 1) / s;
  // At stride 1 pad_planes writes up to the last row's right padding.
  f.phase = round_quantum(std::max({f.hq * f.wq, f.npos + max_off, (h + ph) * f.wp + pw}));
  f.plane = s * s * f.phase;
  for (int64_t i = 0; i < kh; ++i)
    for (int64_t j = 0; j < kw; ++j)
      f.off.push_back(((i % s) * s + j % s) * f.phase + i / s * f.wq + j / s);
  return f;
}

// dst (channels x f.plane): the channels of src in f's layout (zero-padded planes, or their
// phases at a stride).
void layout_planes(const Flat& f, const float* src, int64_t channels, float* dst) {
  if (f.s == 1) return pad_planes(f.pad(), src, channels, dst);
  for (int64_t c = 0; c < channels; ++c) {
    const float* sc = src + c * f.h * f.w;
    for (int64_t a = 0; a < f.s; ++a)
      for (int64_t b = 0; b < f.s; ++b) {
        float* d = dst + c * f.plane + (a * f.s + b) * f.phase;
        // Columns v whose padded column s v + b lies in the image: [v0, v1).
        const int64_t v0 = std::min(f.wq, std::max<int64_t>(0, (f.pw - b + f.s - 1) / f.s));
        const int64_t v1 = std::clamp<int64_t>((f.w - 1 + f.pw - b) / f.s + 1, v0, f.wq);
        for (int64_t u = 0; u < f.hq; ++u) {
          float* row = d + u * f.wq;
          const int64_t r = f.s * u + a - f.ph;
          if (r < 0 || r >= f.h) {
            zero_run(row, f.wq);
            continue;
          }
          const float* srow = sc + r * f.w + b - f.pw;
          zero_run(row, v0);
          for (int64_t v = v0; v < v1; ++v) row[v] = srow[f.s * v];
          zero_run(row + v1, f.wq - v1);
        }
        zero_run(d + f.hq * f.wq, f.phase - f.hq * f.wq);
      }
  }
}

// Packs w (co, ci, kh, kw) as correlate's blocks of kConvOutBlock output channels; `flip`
// packs the input gradient's kernel instead: ci outputs over co inputs, taps reversed.
std::vector<float> pack_weights(const float* w, int64_t co, int64_t ci, int64_t taps, bool flip) {
  const int64_t outs = flip ? ci : co, ins = flip ? co : ci;
  const int64_t blocks = (outs + kConvOutBlock - 1) / kConvOutBlock;
  std::vector<float> p(static_cast<size_t>(blocks * ins * taps * kConvOutBlock));
  // Written in order: (block, input, tap, lane); lanes past `outs` are zero.
  float* d = p.data();
  for (int64_t ob = 0; ob < blocks; ++ob)
    for (int64_t c = 0; c < ins; ++c)
      for (int64_t s = 0; s < taps; ++s)
        for (int64_t l = 0; l < kConvOutBlock; ++l) {
          const int64_t o = ob * kConvOutBlock + l;
          *d++ = o >= outs ? 0.0f
                 : flip    ? w[(c * ci + o) * taps + (taps - 1 - s)]
                           : w[(o * ci + c) * taps + s];
        }
  return p;
}

bool direct_path(const ConvGeom& g, DType t) {
  return t == DType::kF32 && g.pad < g.kh && g.pad < g.kw;
}

// 1x1 without padding: a product per image, no layout to build.
bool pointwise(const ConvGeom& g) { return g.kh == 1 && g.kw == 1 && g.pad == 0 && g.stride == 1; }

// d[i] += r[i] for i < n.
inline void add_run(const float* r, int64_t n, float* d) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) d[i] += r[i];
}

// dst (images, out_ch, f.ho, f.wo) = src (images, in_ch, f.h, f.w) correlated with the packed
// weights, plus bias (or not), plus res (same shape as dst, or not).
void correlate_images(const Flat& f, int64_t images, const float* src, int64_t in_ch,
                      const std::vector<float>& wpk, int64_t out_ch, const float* bias, float* dst,
                      const float* res = nullptr) {
  const int64_t taps = static_cast<int64_t>(f.off.size());
#pragma omp parallel for schedule(static) if (images > 1)
  for (int64_t img = 0; img < images; ++img) {
    float* in = scratch<float>(0, in_ch * f.plane);
    float* tmp = scratch<float>(1, out_ch * f.npos);
    layout_planes(f, src + img * in_ch * f.h * f.w, in_ch, in);
    internal::correlate(
        {in, f.plane, in_ch, f.off.data(), taps, wpk.data(), out_ch, tmp, f.npos, f.npos, bias});
    // Output rows in whole blocks too where both buffers allow (see copy_run).
    const float* tmp_end = tmp + out_ch * f.npos;
    float* img_out = dst + img * out_ch * f.ho * f.wo;
    const float* out_end = img_out + out_ch * f.ho * f.wo;
    const float* img_res = res ? res + img * out_ch * f.ho * f.wo : nullptr;
    for (int64_t o = 0; o < out_ch; ++o)
      for (int64_t y = 0; y < f.ho; ++y) {
        const int64_t d = (o * f.ho + y) * f.wo;
        if (img_res) {
          const float* t = tmp + o * f.npos + y * f.wq;
          const float* r = img_res + d;
          float* out_row = img_out + d;
#pragma omp simd
          for (int64_t x = 0; x < f.wo; ++x) out_row[x] = t[x] + r[x];
        } else {
          copy_run(tmp + o * f.npos + y * f.wq, f.wo, img_out + d, tmp_end, out_end);
        }
      }
  }
}

// dst (images, out_ch, hw) = the packed 1x1 weights times src (images, in_ch, hw), plus bias
// (or not), plus res (or not), read from and written to the tensors themselves: whole vectors
// of positions through correlate, the last hw % kConvQuantum through a zero-padded copy.
void pointwise_images(int64_t images, int64_t hw, const float* src, int64_t in_ch,
                      const std::vector<float>& wpk, int64_t out_ch, const float* bias, float* dst,
                      const float* res = nullptr) {
  const int64_t main = hw / kConvQuantum * kConvQuantum, tail = hw - main, off = 0;
#pragma omp parallel for schedule(static) if (images > 1)
  for (int64_t img = 0; img < images; ++img) {
    const float* in = src + img * in_ch * hw;
    float* out = dst + img * out_ch * hw;
    if (main > 0)
      internal::correlate({in, hw, in_ch, &off, 1, wpk.data(), out_ch, out, hw, main, bias});
    if (tail > 0) {
      float* tin = scratch<float>(0, in_ch * kConvQuantum);
      float* tout = scratch<float>(1, out_ch * kConvQuantum);
      for (int64_t c = 0; c < in_ch; ++c)
        for (int64_t t = 0; t < kConvQuantum; ++t)
          tin[c * kConvQuantum + t] = t < tail ? in[c * hw + main + t] : 0.0f;
      internal::correlate({tin, kConvQuantum, in_ch, &off, 1, wpk.data(), out_ch, tout,
                           kConvQuantum, kConvQuantum, bias});
      for (int64_t o = 0; o < out_ch; ++o)
        for (int64_t t = 0; t < tail; ++t) out[o * hw + main + t] = tout[o * kConvQuantum + t];
    }
    // The residual while the image's output is in cache.
    if (res) add_run(res + img * out_ch * hw, out_ch * hw, out);
  }
}

// out (b, co, ho, wo) = x (b, ci, h, w) correlated with w at g's stride, plus bias, plus res.
void direct_forward(const ConvGeom& g, const float* x, const float* w, const float* bias,
                    float* out, const float* res) {
  const auto wpk = pack_weights(w, g.co, g.ci, g.kh * g.kw, false);
  if (pointwise(g)) return pointwise_images(g.b, g.h * g.w, x, g.ci, wpk, g.co, bias, out, res);
  const Flat f = flat_of(g.h, g.w, g.pad, g.pad, g.kh, g.kw, g.stride);
  correlate_images(f, g.b, x, g.ci, wpk, g.co, bias, out, res);
}

// gx (b, ci, h, w) at stride 1 = gy correlated with w flipped and transposed, at padding
// k - 1 - pad.
void direct_input_grad(const ConvGeom& g, const float* gy, const float* w, float* gx) {
  const auto wpk = pack_weights(w, g.co, g.ci, g.kh * g.kw, true);
  if (pointwise(g)) return pointwise_images(g.b, g.h * g.w, gy, g.co, wpk, g.ci, nullptr, gx);
  const Flat f = flat_of(g.ho, g.wo, g.kh - 1 - g.pad, g.kw - 1 - g.pad, g.kh, g.kw);
  correlate_images(f, g.b, gy, g.co, wpk, g.ci, nullptr, gx);
}

// gx at a stride s > 1, one phase of the padded input at a time. Padded row s u + a and column
// s v + b receive sum over taps i = s m + a, j = s n + b of w[o][c][i][j] gy[o][u - m][v - n]:
// a stride-1 correlation of gy (M = (kh - 1) / s rows and N = (kw - 1) / s columns of zeros in
// front) with the phase's taps, reversed. Phases partition the image, so every element of gx is
// written once.
void strided_input_grad(const ConvGeom& g, const float* gy, const float* w, float* gx) {
  const int64_t s = g.stride, taps = g.kh * g.kw;
  const int64_t m_max = (g.kh - 1) / s, n_max = (g.kw - 1) / s;
  // Phase outputs u < nu, v < nv reach every padded row (column) up to h + pad (w + pad).
  const int64_t nu = (g.h + g.pad + s - 1) / s, nv = (g.w + g.pad + s - 1) / s;
  const int64_t wg = std::max(nv, g.wo) + n_max, hg = std::max(nu, g.ho) + m_max;
  const int64_t npos = round_quantum((nu - 1) * wg + nv);
  const int64_t plane =
      round_quantum(std::max({hg * wg, npos + m_max * wg + n_max, (g.ho + m_max) * wg + n_max}));
  const PadSpec pad{g.ho, g.wo, m_max, n_max, wg, plane};
  struct Phase {
    int64_t a, b;
    std::vector<int64_t> off;
    std::vector<float> wpk;
  };
  std::vector<Phase> phases;
  const int64_t blocks = (g.ci + kConvOutBlock - 1) / kConvOutBlock;
  for (int64_t a = 0; a < s; ++a)
    for (int64_t b = 0; b < s; ++b) {
      Phase ph{a, b, {}, {}};
      std::vector<int64_t> tap;  // i kw + j of each of the phase's taps
      for (int64_t i = a; i < g.kh; i += s)
        for (int64_t j = b; j < g.kw; j += s) {
          ph.off.push_back((m_max - i / s) * wg + n_max - j / s);
          tap.push_back(i * g.kw + j);
        }
      const auto nt = static_cast<int64_t>(tap.size());
      ph.wpk.assign(static_cast<size_t>(blocks * g.co * nt * kConvOutBlock), 0.0f);
      for (int64_t c = 0; c < g.ci; ++c)
        for (int64_t o = 0; o < g.co; ++o)
          for (int64_t t = 0; t < nt; ++t)
            ph.wpk[static_cast<size_t>(((c / kConvOutBlock * g.co + o) * nt + t) * kConvOutBlock +
                                       c % kConvOutBlock)] = w[(o * g.ci + c) * taps + tap[t]];
      phases.push_back(std::move(ph));
    }
#pragma omp parallel for schedule(static) if (g.b > 1)
  for (int64_t img = 0; img < g.b; ++img) {
    float* in = scratch<float>(0, g.co * plane);
    float* tmp = scratch<float>(1, g.ci * npos);
    pad_planes(pad, gy + img * g.co * g.hw_out(), g.co, in);
    float* gxi = gx + img * g.ci * g.h * g.w;
    for (const Phase& ph : phases) {
      const auto nt = static_cast<int64_t>(ph.off.size());
      if (nt > 0)
        internal::correlate(
            {in, plane, g.co, ph.off.data(), nt, ph.wpk.data(), g.ci, tmp, npos, npos, nullptr});
      for (int64_t c = 0; c < g.ci; ++c)
        for (int64_t u = 0; u < nu; ++u) {
          const int64_t r = s * u + ph.a - g.pad;
          if (r < 0 || r >= g.h) continue;
          const float* src = tmp + c * npos + u * wg;
          float* row = gxi + (c * g.h + r) * g.w;
          for (int64_t v = 0; v < nv; ++v) {
            const int64_t col = s * v + ph.b - g.pad;
            if (col >= 0 && col < g.w) row[col] = nt > 0 ? src[v] : 0.0f;
          }
        }
    }
  }
}

// gb[o] += the sum of gy (b, co, ho, wo) over images and positions: 16 interleaved partial
// sums per image (vectorized; one running sum waits on every add), images in order.
void bias_grad(const ConvGeom& g, const float* gy, float* gb) {
  const int64_t hwo = g.hw_out();
  for (int64_t img = 0; img < g.b; ++img)
    for (int64_t o = 0; o < g.co; ++o) {
      const float* row = gy + (img * g.co + o) * hwo;
      float part[16] = {};
      int64_t p = 0;
      for (; p + 16 <= hwo; p += 16)
        for (int k = 0; k < 16; ++k) part[k] += row[p + k];
      for (; p < hwo; ++p) part[p % 16] += row[p];
      for (int half = 8; half >= 1; half /= 2)
        for (int k = 0; k < half; ++k) part[k] += part[k + half];
      gb[o] += part[0];
    }
}

// A source row of zeros for transposes (channels past co, images past the batch).
constexpr float kZeros16[kConvQuantum] = {};

// The pointer pairs of a batch of transposes, kept per thread across calls.
struct TransposeBatch {
  std::vector<const float*> src;
  std::vector<float*> dst;
  void clear() {
    src.clear();
    dst.clear();
  }
  void run() {
    if (!src.empty())
      internal::transpose16(
          {src.data(), dst.data(), static_cast<int64_t>(src.size()) / kConvQuantum});
  }
};

TransposeBatch& transpose_batch() {
  thread_local TransposeBatch t;
  t.clear();
  return t;
}

// gw (co, ci, kh, kw) = sum over images and outputs of gy times the shifted inputs, computed
// transposed (output channels in the vector lanes) from gy transposed to (b, ho, wo, co). With
// gb, also the bias gradient (bias_grad).
void direct_weight_grad(const ConvGeom& g, const float* x, const float* gy, float* gw, float* gb) {
  const Flat f = flat_of(g.h, g.w, g.pad, g.pad, g.kh, g.kw, g.stride);
  const int64_t taps = g.kh * g.kw, hwo = g.hw_out(), co_stride = round_quantum(g.co);
  // At stride 1 the kernel reads x as it is: without padding it reads only real pixels, and the
  // 3- and 5-wide kernels read the padding as zeros themselves (WeightGradArgs::pad).
  const bool unpadded = g.stride == 1 && g.pad > 0 && (g.kw == 3 || g.kw == 5) &&
                        g.w + 2 * g.pad + g.kw <= internal::kWeightGradMaxRow;
  const bool as_is = (g.pad == 0 && g.stride == 1) || unpadded;
  const int64_t x_plane = as_is ? g.h * g.w : f.plane;
  float* xs = as_is ? nullptr : scratch<float>(2, g.b * g.ci * f.plane);
  float* gt = scratch<float>(3, g.b * hwo * co_stride);
  const int64_t whole = hwo / kConvQuantum * kConvQuantum;
#pragma omp parallel for schedule(static) if (g.b > 1)
  for (int64_t img = 0; img < g.b; ++img) {
    if (!as_is) layout_planes(f, x + img * g.ci * g.h * g.w, g.ci, xs + img * g.ci * f.plane);
    // gt's rows of this image: 16 x 16 blocks of (channels, positions) transposed, zeros for the
    // channels past co, then the positions past the last whole block.
    float* t = gt + img * hwo * co_stride;
    const float* s = gy + img * g.co * hwo;
    TransposeBatch& tb = transpose_batch();
    for (int64_t o0 = 0; o0 < co_stride; o0 += kConvQuantum)
      for (int64_t p0 = 0; p0 < whole; p0 += kConvQuantum) {
        for (int64_t i = 0; i < kConvQuantum; ++i)
          tb.src.push_back(o0 + i < g.co ? s + (o0 + i) * hwo + p0 : kZeros16);
        for (int64_t j = 0; j < kConvQuantum; ++j) tb.dst.push_back(t + (p0 + j) * co_stride + o0);
      }
    tb.run();
    for (int64_t p = whole; p < hwo; ++p) {
      float* row = t + p * co_stride;
      for (int64_t o = 0; o < g.co; ++o) row[o] = s[o * hwo + p];
      for (int64_t o = g.co; o < co_stride; ++o) row[o] = 0.0f;
    }
  }
  if (gb) bias_grad(g, gy, gb);
  // Tasks of (16 output channels, a few input channels): about 9 kernel rows each (three
  // channels of a 3x3 kernel: two register tiles on AVX-512).
  const int64_t row_taps = (g.stride == 1 && (g.kw == 3 || g.kw == 5)) ? g.kh : taps;
  const int64_t group = std::max<int64_t>(1, 9 / row_taps);
  const int64_t groups = (g.ci + group - 1) / group, ovecs = co_stride / kConvQuantum;
  std::vector<float> dwt(static_cast<size_t>(g.ci * taps * co_stride));
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t ov = 0; ov < ovecs; ++ov)
    for (int64_t cg = 0; cg < groups; ++cg)
      internal::weight_grad({gt, co_stride, as_is ? x : xs, x_plane, g.ci * x_plane,
                             as_is ? g.w : f.wq, g.b, g.ho, g.wo, g.kh, g.kw, g.stride, f.phase,
                             ov * kConvQuantum, cg * group, std::min(g.ci, (cg + 1) * group),
                             dwt.data(), unpadded ? g.pad : 0, g.h});
  for (int64_t o = 0; o < g.co; ++o)
    for (int64_t k = 0; k < g.ci * taps; ++k) gw[o * g.ci * taps + k] = dwt[k * co_stride + o];
}

// ---- The batch-in-lanes float32 path ----
//
// Images go into the vector lanes: a position holds kConvQuantum images side by side, so a tap
// is a shift by whole positions and only kept outputs are computed, where the flattened layout
// computes its padding columns and rounds positions up to whole vectors (64 positions for 49 at
// 7x7, 224 for 196 at 14x14). A tensor of C channels is laid out [c][group][q][image]: groups of
// kConvQuantum images (zeros past the batch), q a position of the zero-padded plane, whose
// rows are wp = w + pw apart and share their padding as in flat_of. Moving between this layout
// and (B, C, H, W) is a 16 x 16 transpose per 16 positions (internal::transpose16). The weight
// gradient is internal::lane_weight_grad: vectors over images, summed over the lanes at the end.

constexpr int64_t kLanes = kConvQuantum;

int64_t lane_groups(int64_t b) { return (b + kLanes - 1) / kLanes; }

// An h x w plane with ph rows and pw columns of zeros each side: image (y, x) at position
// (y + ph) wp + x + pw, padded (r, c) at r wp + c, `plane` positions in all.
struct LanePlane {
  int64_t h, w, ph, pw, wp, plane;
  int64_t pos(int64_t p) const { return (p / w + ph) * wp + p % w + pw; }
};

LanePlane lane_plane(int64_t h, int64_t w, int64_t ph, int64_t pw) {
  return {h, w, ph, pw, w + pw, (h + 2 * ph) * (w + pw) + pw};
}

// Per unit (group, y < ho, x < wo in order): the offset in floats of padded position
// (y s + row, x s + col) of the group's plane.
std::vector<int64_t> lane_units(const LanePlane& lp, int64_t groups, int64_t ho, int64_t wo,
                                int64_t s, int64_t row, int64_t col) {
  std::vector<int64_t> u;
  u.reserve(static_cast<size_t>(groups * ho * wo));
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t y = 0; y < ho; ++y)
      for (int64_t x = 0; x < wo; ++x)
        u.push_back((g * lp.plane + (y * s + row) * lp.wp + x * s + col) * kLanes);
  return u;
}

// Groups [g0, g1): their part of a lanes-path stage. `team`: the stage splits its own work over
// the OpenMP team; otherwise it runs on the calling thread.
struct GroupRange {
  int64_t g0, g1;
  bool team;
};

// Runs f(range) over all groups: one group range per thread where the groups share out evenly
// (then each thread lays out, correlates and unpacks its own images, and no cache line crosses
// cores between the stages), else once over every group with each stage split on the team.
template <typename F>
void over_groups(int64_t groups, F&& f) {
  const int64_t threads = omp_get_max_threads();
  if (threads > 1 && groups >= threads && (groups % threads == 0 || groups >= 4 * threads)) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < threads; ++t)
      f(GroupRange{groups * t / threads, groups * (t + 1) / threads, false});
  } else {
    f(GroupRange{0, groups, true});
  }
}

// dst ([channels][groups][lp.plane][kLanes]) = src (b, channels, lp.h, lp.w) in lanes, with zero
// padding and zero lanes past b, for the groups of r.
void to_lanes(const LanePlane& lp, const float* src, int64_t b, int64_t channels, float* dst,
              const GroupRange& r) {
  const int64_t groups = lane_groups(b), hw = lp.h * lp.w, whole = hw / kLanes * kLanes;
#pragma omp parallel for collapse(2) \
    schedule(static) if (r.team && channels * (r.g1 - r.g0) * hw > (1 << 14))
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t g = r.g0; g < r.g1; ++g) {
      float* d = dst + (c * groups + g) * lp.plane * kLanes;
      // The padding: before the first row, after each row, after the last.
      std::fill(d, d + lp.pos(0) * kLanes, 0.0f);
      for (int64_t y = 0; y < lp.h; ++y) {
        const int64_t from = lp.pos(y * lp.w) + lp.w;
        const int64_t to = y + 1 < lp.h ? lp.pos((y + 1) * lp.w) : lp.plane;
        std::fill(d + from * kLanes, d + to * kLanes, 0.0f);
      }
      const float* img[kLanes];
      for (int64_t i = 0; i < kLanes; ++i) {
        const int64_t n = g * kLanes + i;
        img[i] = n < b ? src + (n * channels + c) * hw : nullptr;
      }
      TransposeBatch& t = transpose_batch();
      for (int64_t p0 = 0; p0 < whole; p0 += kLanes) {
        for (int64_t i = 0; i < kLanes; ++i) t.src.push_back(img[i] ? img[i] + p0 : kZeros16);
        for (int64_t j = 0; j < kLanes; ++j) t.dst.push_back(d + lp.pos(p0 + j) * kLanes);
      }
      t.run();
      for (int64_t p = whole; p < hw; ++p) {
        float* dp = d + lp.pos(p) * kLanes;
        for (int64_t i = 0; i < kLanes; ++i) dp[i] = img[i] ? img[i][p] : 0.0f;
      }
    }
}

// dst (b, channels, h, w) = src ([channels][groups][h w][kLanes], no padding) out of lanes, plus
// res (dst's shape, or not), for the groups of r.
void from_lanes(int64_t h, int64_t w, const float* src, int64_t b, int64_t channels, float* dst,
                const GroupRange& r, const float* res = nullptr) {
  const int64_t groups = lane_groups(b), hw = h * w, whole = hw / kLanes * kLanes;
#pragma omp parallel for collapse(2) \
    schedule(static) if (r.team && channels * (r.g1 - r.g0) * hw > (1 << 14))
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t g = r.g0; g < r.g1; ++g) {
      const float* s = src + (c * groups + g) * hw * kLanes;
      // Lanes past the batch land in a sink.
      float sink[kLanes * kLanes];
      float* img[kLanes];
      for (int64_t j = 0; j < kLanes; ++j) {
        const int64_t n = g * kLanes + j;
        img[j] = n < b ? dst + (n * channels + c) * hw : nullptr;
      }
      TransposeBatch& t = transpose_batch();
      for (int64_t p0 = 0; p0 < whole; p0 += kLanes) {
        for (int64_t i = 0; i < kLanes; ++i) t.src.push_back(s + (p0 + i) * kLanes);
        for (int64_t j = 0; j < kLanes; ++j)
          t.dst.push_back(img[j] ? img[j] + p0 : sink + j * kLanes);
      }
      t.run();
      for (int64_t p = whole; p < hw; ++p)
        for (int64_t j = 0; j < kLanes; ++j)
          if (img[j]) img[j][p] = s[p * kLanes + j];
      for (int64_t j = 0; j < kLanes && res; ++j)
        if (img[j]) add_run(res + (img[j] - dst), hw, img[j]);
    }
}

// out (kLanes floats per unit and channel, `units` of them per channel) = the correlation of
// `in` over the units of r's groups (per_group units each). On the team each thread takes whole
// blocks of output channels where there are enough to share (a few dozen units split in two
// would leave one thread a tile more than the other), else a share of the units. Every output
// is one call's, so the bits do not depend on the split.
void correlate_units(const float* in, int64_t in_plane, int64_t ci, const std::vector<int64_t>& off,
                     const std::vector<float>& wpk, int64_t co, const float* bias,
                     const std::vector<int64_t>& units, int64_t per_group, float* out,
                     const GroupRange& r) {
  const auto n = static_cast<int64_t>(units.size());
  const auto taps = static_cast<int64_t>(off.size());
  const int64_t u_lo = r.g0 * per_group, u_hi = r.g1 * per_group;
  const int64_t blocks = (co + kConvOutBlock - 1) / kConvOutBlock;
  const int64_t parts =
      r.team ? std::clamp<int64_t>(omp_get_max_threads(), 1, std::max(blocks, (u_hi - u_lo) / 24))
             : 1;
  const bool by_out = blocks >= 2 * parts || blocks % parts == 0;
#pragma omp parallel for schedule(static) if (parts > 1)
  for (int64_t t = 0; t < parts; ++t) {
    int64_t b0 = 0, b1 = blocks, u0 = u_lo, u1 = u_hi;
    if (by_out) {
      b0 = blocks * t / parts;
      b1 = blocks * (t + 1) / parts;
    } else {
      u0 = u_lo + (u_hi - u_lo) * t / parts;
      u1 = u_lo + (u_hi - u_lo) * (t + 1) / parts;
    }
    const int64_t o0 = b0 * kConvOutBlock, o1 = std::min(co, b1 * kConvOutBlock);
    if (o1 > o0 && u1 > u0)
      internal::correlate({in, in_plane, ci, off.data(), taps,
                           wpk.data() + b0 * ci * taps * kConvOutBlock, o1 - o0,
                           out + (o0 * n + u0) * kLanes, n * kLanes, (u1 - u0) * kLanes,
                           bias ? bias + o0 : nullptr, units.data() + u0});
  }
}

// Tap offsets (i wp + j) kLanes of a kh x kw kernel.
std::vector<int64_t> lane_taps(const LanePlane& lp, int64_t kh, int64_t kw) {
  std::vector<int64_t> off;
  for (int64_t i = 0; i < kh; ++i)
    for (int64_t j = 0; j < kw; ++j) off.push_back((i * lp.wp + j) * kLanes);
  return off;
}

// Whether the lanes waste less than the flattened layout: lanes past the batch against the
// padding columns and the rounding of flat_of's positions. At stride 1 by a fifth or more, to pay
// for the transposes (measured at batch 32 on one core: 7x7 images, 31% wasted flat, run 17%
// faster in lanes; 14x14, 14% wasted, as fast either way); at a stride the phase planes cost a
// layout of their own, so equal waste will do. 1x1 products without padding waste nothing in
// place.
bool lanes_path(const ConvGeom& g) {
  if (pointwise(g)) return false;
  const Flat f = flat_of(g.h, g.w, g.pad, g.pad, g.kh, g.kw, g.stride);
  const int64_t lanes = lane_groups(g.b) * kLanes * g.hw_out(), flat = g.b * f.npos;
  return g.stride > 1 ? lanes <= flat : 6 * lanes <= 5 * flat;
}

// out (b, co, ho, wo) = x correlated with w plus bias, through lanes; returns x in lanes when
// `keep` (for the weight gradient), else an undefined tensor (x in lanes then lives in scratch).
Tensor lanes_forward(const ConvGeom& g, const float* x, const float* w, const float* bias,
                     float* out, const float* res, bool keep) {
  const LanePlane lp = lane_plane(g.h, g.w, g.pad, g.pad);
  const int64_t groups = lane_groups(g.b), in_plane = groups * lp.plane * kLanes;
  Tensor xl = keep ? Tensor::uninitialized({g.ci * in_plane}, DType::kF32) : Tensor();
  float* px = keep ? xl.data<float>() : scratch<float>(0, g.ci * in_plane);
  const auto units = lane_units(lp, groups, g.ho, g.wo, g.stride, 0, 0);
  const auto taps = lane_taps(lp, g.kh, g.kw);
  const auto wpk = pack_weights(w, g.co, g.ci, g.kh * g.kw, false);
  float* ol = scratch<float>(1, g.co * groups * g.hw_out() * kLanes);
  over_groups(groups, [&](const GroupRange& r) {
    to_lanes(lp, x, g.b, g.ci, px, r);
    correlate_units(px, in_plane, g.ci, taps, wpk, g.co, bias, units, g.hw_out(), ol, r);
    from_lanes(g.ho, g.wo, ol, g.b, g.co, out, r, res);
  });
  return xl;
}

// Whether the weight gradient of a lanes-path convolution is taken in lanes (from x in lanes)
// or by direct_weight_grad (from x): at stride 1 direct_weight_grad visits only real positions
// too and keeps its gradients in registers across the whole sum (lane_weight_grad reduces its
// lanes at the end); at a stride its phase layout wastes what the lanes do not.
bool lanes_weight_grad(const ConvGeom& g) { return g.stride > 1; }

// The three gradients of the lanes path, from x (lanes_weight_grad false) or x in lanes
// (lanes_forward's). The input gradient at stride 1 correlates gy in lanes (padded by
// k - 1 - pad) with the flipped kernel; at a stride it takes the phases of strided_input_grad.
std::vector<Tensor> lanes_backward(const ConvGeom& g, const Tensor& xk, const Tensor& w,
                                   const Tensor& gy, bool has_bias, bool need_x, bool need_w) {
  Tensor gx, gw, gb;
  const float* pg = gy.data<float>();
  const int64_t groups = lane_groups(g.b), taps = g.kh * g.kw;
  const bool lanes_w = need_w && lanes_weight_grad(g);
  if (has_bias) {
    gb = Tensor::zeros({g.co}, DType::kF32);
    if (!need_w || lanes_w) bias_grad(g, pg, gb.data<float>());
  }
  const bool corr_x = need_x && g.stride == 1;
  const LanePlane gp = corr_x ? lane_plane(g.ho, g.wo, g.kh - 1 - g.pad, g.kw - 1 - g.pad)
                              : lane_plane(g.ho, g.wo, 0, 0);
  const int64_t gy_plane = groups * gp.plane * kLanes;
  float* gyl = corr_x || lanes_w ? scratch<float>(2, g.co * gy_plane) : nullptr;
  if (need_x) gx = Tensor::uninitialized({g.b, g.ci, g.h, g.w}, DType::kF32);
  if (corr_x) {
    // gy into lanes, the correlation and gx out of lanes, group by group.
    float* gxl = scratch<float>(1, g.ci * groups * g.h * g.w * kLanes);
    const auto units = lane_units(gp, groups, g.h, g.w, 1, 0, 0);
    const auto off = lane_taps(gp, g.kh, g.kw);
    const auto wpk = pack_weights(w.data<float>(), g.co, g.ci, taps, true);
    over_groups(groups, [&](const GroupRange& r) {
      to_lanes(gp, pg, g.b, g.co, gyl, r);
      correlate_units(gyl, gy_plane, g.co, off, wpk, g.ci, nullptr, units, g.h * g.w, gxl, r);
      from_lanes(g.h, g.w, gxl, g.b, g.ci, gx.data<float>(), r);
    });
  } else if (lanes_w) {
    to_lanes(gp, pg, g.b, g.co, gyl, GroupRange{0, groups, true});
  }
  if (need_x && !corr_x) strided_input_grad(g, pg, w.data<float>(), gx.data<float>());
  if (need_w && !lanes_w) {
    gw = Tensor::uninitialized(w.shape(), DType::kF32);
    direct_weight_grad(g, xk.data<float>(), pg, gw.data<float>(),
                       has_bias ? gb.data<float>() : nullptr);
  } else if (need_w) {
    gw = Tensor::uninitialized(w.shape(), DType::kF32);
    const LanePlane lp = lane_plane(g.h, g.w, g.pad, g.pad);
    const int64_t x_plane = groups * lp.plane * kLanes;
    const auto x_off = lane_units(lp, groups, g.ho, g.wo, g.stride, 0, 0);
    const auto gy_off = lane_units(gp, groups, g.ho, g.wo, 1, gp.ph, gp.pw);
    std::vector<int64_t> roff, dst;
    for (int64_t c = 0; c < g.ci; ++c)
      for (int64_t i = 0; i < g.kh; ++i)
        for (int64_t j = 0; j < g.kw; ++j) {
          roff.push_back(c * x_plane + (i * lp.wp + j) * kLanes);
          dst.push_back((c * g.kh + i) * g.kw + j);
        }
    // Tasks of 4 output channels x 36 entries (whole tiles on every instruction set).
    constexpr int64_t kOuts = 4, kEntries = 36;
    const int64_t entries = g.ci * taps, oblocks = (g.co + kOuts - 1) / kOuts,
                  eblocks = (entries + kEntries - 1) / kEntries;
    const float* px = xk.data<float>();
    float* pw = gw.data<float>();
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t ob = 0; ob < oblocks; ++ob)
      for (int64_t eb = 0; eb < eblocks; ++eb) {
        const int64_t e0 = eb * kEntries;
        internal::lane_weight_grad({gyl, gy_off.data(), px, x_off.data(),
                                    static_cast<int64_t>(x_off.size()), roff.data() + e0,
                                    dst.data() + e0, std::min(kEntries, entries - e0), gy_plane,
                                    ob * kOuts, std::min(g.co, (ob + 1) * kOuts), pw, entries});
      }
  }
  return {gx, gw, gb};
}

// The three gradients of the direct path; every element of gx and gw is written.
std::vector<Tensor> direct_backward(const ConvGeom& g, const Tensor& x, const Tensor& w,
                                    const Tensor& gy, bool has_bias, bool need_x, bool need_w) {
  Tensor gx, gw, gb;
  const float* pg = gy.data<float>();
  if (need_x) {
    gx = Tensor::uninitialized(x.shape(), DType::kF32);
    if (g.stride == 1)
      direct_input_grad(g, pg, w.data<float>(), gx.data<float>());
    else
      strided_input_grad(g, pg, w.data<float>(), gx.data<float>());
  }
  if (has_bias) gb = Tensor::zeros({g.co}, DType::kF32);
  if (need_w) {
    gw = Tensor::uninitialized(w.shape(), DType::kF32);
    direct_weight_grad(g, x.data<float>(), pg, gw.data<float>(),
                       has_bias ? gb.data<float>() : nullptr);
  } else if (has_bias) {
    bias_grad(g, pg, gb.data<float>());
  }
  return {gx, gw, gb};
}

ConvGeom geom_of(const Shape& x, const Shape& w, int64_t stride, int64_t padding) {
  ConvGeom g{x[0], x[1], x[2], x[3], w[0], w[2], w[3], stride, padding, 0, 0};
  g.ho = (g.h + 2 * padding - g.kh) / stride + 1;
  g.wo = (g.w + 2 * padding - g.kw) / stride + 1;
  return g;
}

// The gradients (x, w, bias) of a conv2d: through lanes, the direct kernels or im2col + GEMM.
std::vector<Tensor> conv_grads(const ConvGeom& g, const Tensor& dx, const Tensor& dw,
                               const Tensor& xl, const Tensor& gc, bool has_bias, bool need_x,
                               bool need_w, bool direct, bool lanes) {
  if (lanes) return lanes_backward(g, xl.defined() ? xl : dx, dw, gc, has_bias, need_x, need_w);
  if (direct) return direct_backward(g, dx, dw, gc, has_bias, need_x, need_w);
  Tensor gx = need_x ? Tensor::zeros(dx.shape(), dx.dtype()) : Tensor();
  Tensor gw = Tensor::zeros(dw.shape(), dw.dtype());
  Tensor gb = has_bias ? Tensor::zeros({g.co}, dw.dtype()) : Tensor();
  dispatch_float(dw.dtype(), "conv2d", [&]<typename T>() {
    const int64_t chunk = g.chunk(), hwo = g.hw_out();
    T* col = scratch<T>(0, g.krows() * chunk * hwo);
    T* gout = scratch<T>(1, g.co * chunk * hwo);
    const T* pg = gc.data<T>();
    const T* pw = dw.data<T>();
    T* pgw = gw.data<T>();
    for (int64_t n0 = 0; n0 < g.b; n0 += chunk) {
      const int64_t n = std::min(chunk, g.b - n0), cols = n * hwo;
      // gout (co, n hwo): the chunk's output gradient in the GEMM's layout.
      for (int64_t img = 0; img < n; ++img) {
        for (int64_t o = 0; o < g.co; ++o) {
          const T* src = pg + ((n0 + img) * g.co + o) * hwo;
          std::copy(src, src + hwo, gout + o * cols + img * hwo);
        }
      }
      if (has_bias) {
        T* pgb = gb.data<T>();
        for (int64_t o = 0; o < g.co; ++o) {
          T s = 0;
          const T* row = gout + o * cols;
          for (int64_t p = 0; p < cols; ++p) s += row[p];
          pgb[o] += s;
        }
      }
      if (need_w) {
        im2col<T>(g, dx.data<T>(), n0, n, col);
        // gW (co, krows) += gout (co, cols) x col^T (cols, krows)
        gemm<T>(false, true, g.co, g.krows(), cols, T(1), gout, cols, col, cols, T(1), pgw,
                g.krows());
      }
      if (need_x) {
        // gcol (krows, cols) = W^T (krows, co) x gout (co, cols), reusing `col`.
        gemm<T>(true, false, g.krows(), cols, g.co, T(1), pw, g.krows(), gout, cols, T(0), col,
                cols);
        col2im_add<T>(g, col, n0, n, gx.data<T>());
      }
    }
  });
  return std::vector<Tensor>{gx, need_w ? gw : Tensor(), gb};
}

}  // namespace

namespace internal {
const char* conv2d_cpu_path(const Shape& x, const Shape& w, int64_t stride, int64_t padding,
                            DType dtype) {
  const ConvGeom g = geom_of(x, w, stride, padding);
  if (!direct_path(g, dtype)) return "im2col";
  if (lanes_path(g)) return "lanes";
  return pointwise(g) ? "pointwise" : "flat";
}
}  // namespace internal

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t stride, int64_t padding,
              const Tensor& residual) {
  const char* op = "conv2d";
  STARLING_OP_CHECK(x.dim() == 4, op, "input must be (B, C_in, H, W), got " + shape_str(x.shape()));
  STARLING_OP_CHECK(w.dim() == 4, op,
                    "weight must be (C_out, C_in, kH, kW), got " + shape_str(w.shape()));
  STARLING_OP_CHECK(x.dtype() == w.dtype(), op, "input and weight dtypes differ");
  STARLING_OP_CHECK(
      w.shape()[1] == x.shape()[1], op,
      "input " + shape_str(x.shape()) + " does not match weight " + shape_str(w.shape()));
  STARLING_OP_CHECK(stride >= 1 && padding >= 0, op,
                    "stride must be >= 1 and padding >= 0, got stride " + std::to_string(stride) +
                        " padding " + std::to_string(padding));
  ConvGeom g = geom_of(x.shape(), w.shape(), stride, padding);
  STARLING_OP_CHECK(
      g.h + 2 * padding >= g.kh && g.w + 2 * padding >= g.kw, op,
      "kernel " + shape_str(w.shape()) + " larger than padded input " + shape_str(x.shape()));
  const bool has_bias = bias.defined();
  STARLING_OP_CHECK(!has_bias || (bias.numel() == g.co && bias.dtype() == x.dtype()), op,
                    "bias must be (C_out) = (" + std::to_string(g.co) + ") of the input's dtype");
  const bool has_res = residual.defined();
  STARLING_OP_CHECK(
      !has_res ||
          (residual.shape() == Shape{g.b, g.co, g.ho, g.wo} && residual.dtype() == x.dtype()),
      op,
      "residual must be the output's shape " + shape_str({g.b, g.co, g.ho, g.wo}) +
          " and dtype, got " + (has_res ? shape_str(residual.shape()) : std::string()));
  if (internal::any_on_device({&x, &w, &bias, &residual})) {
    return internal::device_ops_for(op, {&x, &w, &bias, &residual})
        .conv2d(x, w, bias, stride, padding, residual);
  }
  const Tensor xc = x.contiguous(), wc = w.contiguous();
  const Tensor bc = has_bias ? bias.contiguous() : Tensor();
  const Tensor rc = has_res ? residual.contiguous() : Tensor();
  Tensor out = Tensor::uninitialized({g.b, g.co, g.ho, g.wo}, x.dtype());
  const bool direct = direct_path(g, x.dtype());
  const bool lanes = direct && lanes_path(g);
  // For the weight gradient the lanes path keeps x, or x in lanes (lanes_weight_grad).
  const bool keep_xl =
      lanes && lanes_weight_grad(g) && w.requires_grad() && autograd::needs_grad({&x, &w, &bias});
  Tensor xl;
  if (lanes) {
    xl = lanes_forward(g, xc.data<float>(), wc.data<float>(), has_bias ? bc.data<float>() : nullptr,
                       out.data<float>(), has_res ? rc.data<float>() : nullptr, keep_xl);
  } else if (direct) {
    direct_forward(g, xc.data<float>(), wc.data<float>(), has_bias ? bc.data<float>() : nullptr,
                   out.data<float>(), has_res ? rc.data<float>() : nullptr);
  } else {
    dispatch_float(x.dtype(), op, [&]<typename T>() {
      const int64_t chunk = g.chunk(), hwo = g.hw_out();
      T* col = scratch<T>(0, g.krows() * chunk * hwo);
      T* tmp = scratch<T>(1, g.co * chunk * hwo);
      const T* px = xc.data<T>();
      const T* pw = wc.data<T>();
      const T* pb = has_bias ? bc.data<T>() : nullptr;
      const T* pr = has_res ? rc.data<T>() : nullptr;
      T* po = out.data<T>();
      for (int64_t n0 = 0; n0 < g.b; n0 += chunk) {
        const int64_t n = std::min(chunk, g.b - n0), cols = n * hwo;
        im2col<T>(g, px, n0, n, col);
        // tmp (co, n hwo) = W (co, krows) x col (krows, n hwo)
        gemm<T>(false, false, g.co, cols, g.krows(), T(1), pw, g.krows(), col, cols, T(0), tmp,
                cols);
#pragma omp parallel for collapse(2) if (g.co * cols > (1 << 15))
        for (int64_t img = 0; img < n; ++img) {
          for (int64_t o = 0; o < g.co; ++o) {
            const T* src = tmp + o * cols + img * hwo;
            T* dst = po + ((n0 + img) * g.co + o) * hwo;
            const T bv = pb ? pb[o] : T(0);
            for (int64_t p = 0; p < hwo; ++p) dst[p] = src[p] + bv;
            if (pr) {
              const T* r = pr + ((n0 + img) * g.co + o) * hwo;
              for (int64_t p = 0; p < hwo; ++p) dst[p] += r[p];
            }
          }
        }
      }
    });
  }
  if (!autograd::needs_grad({&x, &w, &bias, &residual})) return out;
  const bool need_x = x.requires_grad(), need_w = w.requires_grad();
  const Tensor dx = lanes && (keep_xl || !need_w) ? Tensor() : xc.detach(), dw = wc.detach();
  return autograd::record(
      out, op, {x, w, bias, residual},
      [dx, dw, xl, g, has_bias, has_res, need_x, need_w, direct, lanes](const Tensor& grad) {
        const Tensor gc = grad.contiguous();
        // The residual's gradient is the output's.
        std::vector<Tensor> grads =
            conv_grads(g, dx, dw, xl, gc, has_bias, need_x, need_w, direct, lanes);
        if (has_res) grads.push_back(gc);
        return grads;
      });
}

}  // namespace starling::ops
