// CPU group norm: statistics per (image, group) in double accumulation, saved for backward
// (float data: sum and sum of squares in one pass; double data: the mean, then squared
// deviations).
// Sums run over 8 interleaved double partial sums (a fixed order the compiler vectorizes; a
// single running sum is bound by the latency of one add per element).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/autograd/autograd.h"
#include "core/ops/device_ops.h"
#include "core/ops/internal/fast_math.h"
#include "core/ops/internal/op_util.h"
#include "core/ops/norm2d.h"

namespace starling::ops {

namespace {

// Eight partial sums added in a fixed tree.
inline double sum8(const double* p) {
  return ((p[0] + p[4]) + (p[1] + p[5])) + ((p[2] + p[6]) + (p[3] + p[7]));
}

// The sum of f(j) for j < n in double: 8 partial sums, then the tail.
template <typename F>
double dsum(int64_t n, F f) {
  double acc[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) acc[k] += f(j + k);
  double tail = 0;
  for (; j < n; ++j) tail += f(j);
  return sum8(acc) + tail;
}

// Eight doubles, one per partial sum: GCC vectors, so the partial sums are lanes whatever the
// instruction set (one zmm, two ymm, four xmm) and the bits are the same on each. They never
// cross this file's boundary, so the psABI note on passing them by value does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
using D8 = double __attribute__((vector_size(64)));
using F8 = float __attribute__((vector_size(32)));

inline D8 load_d8(const float* p) {
  F8 f;
  std::memcpy(&f, p, sizeof f);
  return __builtin_convertvector(f, D8);
}

inline double sum8(D8 v) {
  double p[8];
  std::memcpy(p, &v, sizeof p);
  return sum8(p);
}

// The sums of x[j] and x[j]^2 for j < n in double, in one pass: 8 partial sums of each.
std::pair<double, double> dsum2(int64_t n, const float* x) {
  D8 a = {}, q = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const D8 d = load_d8(x + j);
    a += d;
    q += d * d;
  }
  double ta = 0, tq = 0;
  for (; j < n; ++j) {
    const double d = static_cast<double>(x[j]);
    ta += d;
    tq += d * d;
  }
  return {sum8(a) + ta, sum8(q) + tq};
}

// The sums of g[j], g[j] (x[j] - m) and (with kX) x[j] for j < n in double, in one pass over
// both rows.
struct RowSums {
  double g, gx, x;
};

template <bool kX>
RowSums dsum_gx(int64_t n, const float* g, const float* x, double m) {
  D8 a = {}, q = {}, s = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const D8 gd = load_d8(g + j), xd = load_d8(x + j);
    a += gd;
    q += gd * (xd - m);
    if constexpr (kX) s += xd;
  }
  double ta = 0, tq = 0, ts = 0;
  for (; j < n; ++j) {
    const double gd = static_cast<double>(g[j]), xd = static_cast<double>(x[j]);
    ta += gd;
    tq += gd * (xd - m);
    ts += xd;
  }
  return {sum8(a) + ta, sum8(q) + tq, kX ? sum8(s) + ts : 0.0};
}

using internal::exp_t;

// A channel's y = a x + sh: a = rs w, sh = b - m a (forward and SiLU's backward alike).
template <typename T>
std::pair<T, T> channel_affine(double m, double rs, T w, T b) {
  const T a = static_cast<T>(rs) * w;
  return {a, b - static_cast<T>(m) * a};
}

// y = a x + sh, then SiLU (or not), over n elements.
template <typename T, bool kSilu>
void affine_row(const T* x, int64_t n, T a, T sh, T* y) {
#pragma omp simd
  for (int64_t p = 0; p < n; ++p) {
    const T z = x[p] * a + sh;
    if constexpr (kSilu) {
      y[p] = z / (1 + exp_t(-z));
    } else {
      y[p] = z;
    }
  }
}

// The gradient that reaches the normalized value through SiLU: g silu'(z), z = a x + sh.
template <typename T>
void silu_grad_row(const T* g, const T* x, int64_t n, T a, T sh, T* gz) {
#pragma omp simd
  for (int64_t p = 0; p < n; ++p) {
    const T z = x[p] * a + sh;
    const T sig = 1 / (1 + exp_t(-z));
    gz[p] = g[p] * sig * (1 + z * (1 - sig));
  }
}

// group_norm, then SiLU when `silu`, of x + shift[:, :, None, None] when shift is defined: one
// read of x and one write of y forward; backward reads g and x once per (image, group) row (the
// row stays in L1 between its passes). The shifted input is never formed: a channel's shift t
// moves its sums (s1 + n t, s2 + 2 t s1 + n t^2), its mean as seen from x (m - t) and the
// constant of its input gradient.
Tensor group_norm_impl(const char* op, const Tensor& x, int64_t groups, const Tensor& weight,
                       const Tensor& bias, double eps, bool silu, const Tensor& shift) {
  STARLING_OP_CHECK(x.dim() >= 2, op, "input must be (B, C, ...), got " + shape_str(x.shape()));
  const int64_t b = x.shape()[0], c = x.shape()[1];
  STARLING_OP_CHECK(
      groups >= 1 && c % groups == 0, op,
      std::to_string(groups) + " groups do not divide " + std::to_string(c) + " channels");
  STARLING_OP_CHECK(weight.numel() == c && weight.dtype() == x.dtype(), op,
                    "weight must be (C) = (" + std::to_string(c) + ") of the input's dtype");
  const bool has_bias = bias.defined();
  STARLING_OP_CHECK(!has_bias || (bias.numel() == c && bias.dtype() == x.dtype()), op,
                    "bias must be (C) of the input's dtype");
  const bool has_shift = shift.defined();
  STARLING_OP_CHECK(!has_shift || (shift.dim() == 2 && shift.shape()[0] == b &&
                                   shift.shape()[1] == c && shift.dtype() == x.dtype()),
                    op,
                    "shift must be (B, C) = (" + std::to_string(b) + ", " + std::to_string(c) +
                        ") of the input's dtype");
  if (internal::any_on_device({&x, &weight, &bias, &shift})) {
    return internal::device_ops_for(op, {&x, &weight, &bias, &shift})
        .group_norm(x, shift, groups, weight, bias, eps, silu);
  }
  const int64_t hw = x.numel() / (b * c), cg = c / groups, rows = b * groups, len = cg * hw;
  const Tensor xc = x.contiguous(), wc = weight.contiguous();
  const Tensor bc = has_bias ? bias.contiguous() : Tensor();
  const Tensor sc = has_shift ? shift.contiguous() : Tensor();
  Tensor out = Tensor::uninitialized(x.shape(), x.dtype());
  Tensor mean_t = Tensor::uninitialized({rows}, DType::kF64);
  Tensor rstd_t = Tensor::uninitialized({rows}, DType::kF64);
  internal::dispatch_float(x.dtype(), op, [&]<typename T>() {
    const T* px = xc.data<T>();
    const T* pw = wc.data<T>();
    const T* pb = has_bias ? bc.data<T>() : nullptr;
    T* po = out.data<T>();
    double* pm = mean_t.data<double>();
    double* pr = rstd_t.data<double>();
    const T* ps = has_shift ? sc.data<T>() : nullptr;
#pragma omp parallel for if (x.numel() > (1 << 15))
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = px + r * len;
      // The row's channels' shifts (row r is image r / groups, channels from (r % groups) cg).
      const T* rs_shift = ps ? ps + (r / groups) * c + (r % groups) * cg : nullptr;
      double m, v;
      if (rs_shift) {
        // Per channel, then moved by its shift.
        double s1 = 0, s2 = 0;
        for (int64_t ch = 0; ch < cg; ++ch) {
          const T* xch = row + ch * hw;
          double a1, a2;
          if constexpr (std::is_same_v<T, float>) {
            std::tie(a1, a2) = dsum2(hw, xch);
          } else {
            a1 = dsum(hw, [xch](int64_t j) { return static_cast<double>(xch[j]); });
            a2 = dsum(hw, [xch](int64_t j) {
              return static_cast<double>(xch[j]) * static_cast<double>(xch[j]);
            });
          }
          const auto t = static_cast<double>(rs_shift[ch]);
          const auto n = static_cast<double>(hw);
          s1 += a1 + n * t;
          s2 += a2 + 2 * t * a1 + n * t * t;
        }
        m = s1 / static_cast<double>(len);
        v = std::max(0.0, s2 / static_cast<double>(len) - m * m);
      } else if constexpr (std::is_same_v<T, float>) {
        // Float data in double sums: E[x^2] - m^2 loses nothing a float could hold, and both
        // sums come from one read of the row.
        const auto [s1, s2] = dsum2(len, row);
        m = s1 / static_cast<double>(len);
        v = std::max(0.0, s2 / static_cast<double>(len) - m * m);
      } else {
        m = dsum(len, [row](int64_t j) { return static_cast<double>(row[j]); }) /
            static_cast<double>(len);
        v = dsum(len,
                 [row, m](int64_t j) {
                   const double d = static_cast<double>(row[j]) - m;
                   return d * d;
                 }) /
            static_cast<double>(len);
      }
      const double rs = 1.0 / std::sqrt(v + eps);
      pm[r] = m;
      pr[r] = rs;
      const int64_t c0 = (r % groups) * cg;
      T* orow = po + r * len;
      for (int64_t ch = 0; ch < cg; ++ch) {
        // x + t normalized with mean m is x normalized with mean m - t.
        const double mc = rs_shift ? m - static_cast<double>(rs_shift[ch]) : m;
        const auto [a, sh] = channel_affine<T>(mc, rs, pw[c0 + ch], pb ? pb[c0 + ch] : T(0));
        if (silu)
          affine_row<T, true>(row + ch * hw, hw, a, sh, orow + ch * hw);
        else
          affine_row<T, false>(row + ch * hw, hw, a, sh, orow + ch * hw);
      }
    }
  });
  if (!autograd::needs_grad({&x, &weight, &bias, &shift})) return out;
  return autograd::record(
      out, op, {x, weight, bias, shift},
      [xc, wc, bc, sc, mean_t, rstd_t, has_bias, has_shift, silu, b, c, groups, hw, cg, rows, len,
       op](const Tensor& g) {
        const Tensor gc = g.contiguous();
        Tensor gx = Tensor::uninitialized(xc.shape(), xc.dtype());
        Tensor gw = Tensor::uninitialized({c}, xc.dtype());
        Tensor gb = Tensor::uninitialized({c}, xc.dtype());
        Tensor gs = has_shift ? Tensor::uninitialized({b, c}, xc.dtype()) : Tensor();
        internal::dispatch_float(xc.dtype(), op, [&]<typename T>() {
          const T* px = xc.data<T>();
          const T* pw = wc.data<T>();
          const T* pb = has_bias ? bc.data<T>() : nullptr;
          const T* ps = has_shift ? sc.data<T>() : nullptr;
          T* pgs = has_shift ? gs.data<T>() : nullptr;
          const T* pg = gc.data<T>();
          const double* pm = mean_t.data<double>();
          const double* pr = rstd_t.data<double>();
          T* pgx = gx.data<T>();
          // Per (image, channel): sum(g) and sum(g x_hat), the pieces of every gradient, and under
          // a shift sum(x).
          std::vector<double> sg(static_cast<size_t>(b * c)), sgx(static_cast<size_t>(b * c));
          std::vector<double> sx(has_shift ? static_cast<size_t>(b * c) : 0);
#pragma omp parallel for if (xc.numel() > (1 << 15))
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t c0 = (r % groups) * cg, img = r / groups;
            const double m = pm[r], rs = pr[r];
            // A channel's mean as seen from x: m, or m - t under a shift t.
            const auto mean_of = [&](int64_t ch) {
              return ps ? m - static_cast<double>(ps[img * c + c0 + ch]) : m;
            };
            const T* row = px + r * len;
            T* gxrow = pgx + r * len;
            // Through SiLU: the normalized value's gradient, kept in gx's row until the end.
            const T* grow = pg + r * len;
            if (silu) {
              for (int64_t ch = 0; ch < cg; ++ch) {
                const auto [a, sh] =
                    channel_affine<T>(mean_of(ch), rs, pw[c0 + ch], pb ? pb[c0 + ch] : T(0));
                silu_grad_row<T>(grow + ch * hw, row + ch * hw, hw, a, sh, gxrow + ch * hw);
              }
              grow = gxrow;
            }
            // dx = rs (dxh - mean(dxh) - x_hat mean(dxh x_hat)), dxh = g w. Under a shift, also
            // each channel's sum of x (for its shift's gradient below).
            double mean_d = 0, mean_dx = 0;
            for (int64_t ch = 0; ch < cg; ++ch) {
              const T* gch = grow + ch * hw;
              const T* xch = row + ch * hw;
              const double mc = mean_of(ch);
              double s1, s2;
              if constexpr (std::is_same_v<T, float>) {
                const RowSums rsum =
                    ps ? dsum_gx<true>(hw, gch, xch, mc) : dsum_gx<false>(hw, gch, xch, mc);
                s1 = rsum.g;
                s2 = rs * rsum.gx;
                if (ps) sx[static_cast<size_t>(img * c + c0 + ch)] = rsum.x;
              } else {
                s1 = dsum(hw, [gch](int64_t p) { return static_cast<double>(gch[p]); });
                s2 = rs * dsum(hw, [gch, xch, mc](int64_t p) {
                       return static_cast<double>(gch[p]) * (static_cast<double>(xch[p]) - mc);
                     });
                if (ps)
                  sx[static_cast<size_t>(img * c + c0 + ch)] =
                      dsum(hw, [xch](int64_t p) { return static_cast<double>(xch[p]); });
              }
              sg[static_cast<size_t>(img * c + c0 + ch)] = s1;
              sgx[static_cast<size_t>(img * c + c0 + ch)] = s2;
              mean_d += s1 * static_cast<double>(pw[c0 + ch]);
              mean_dx += s2 * static_cast<double>(pw[c0 + ch]);
            }
            mean_d /= static_cast<double>(len);
            mean_dx /= static_cast<double>(len);
            // Per channel, dx = a g + b x + c: rs w, -rs^2 mean_dx and rs (m rs mean_dx - mean_d)
            // (m: the channel's mean as seen from x), folded in double, applied in T (16 lanes of
            // float, not 8 of double). grow may be gxrow itself: each element is read before it
            // is written. A shift's gradient is the sum of its channel's dx: a sum(g) + b sum(x)
            // + n c, from the sums already taken.
            for (int64_t ch = 0; ch < cg; ++ch) {
              const double ad = rs * static_cast<double>(pw[c0 + ch]), bd = -rs * rs * mean_dx;
              const double cd = rs * (mean_of(ch) * rs * mean_dx - mean_d);
              const T a = static_cast<T>(ad), bx = static_cast<T>(bd), cc = static_cast<T>(cd);
              const T* gsrc = grow + ch * hw;
              const T* xsrc = row + ch * hw;
              if (pgs) {
                const auto k = static_cast<size_t>(img * c + c0 + ch);
                pgs[img * c + c0 + ch] =
                    static_cast<T>(ad * sg[k] + bd * sx[k] + static_cast<double>(hw) * cd);
              }
              T* gdst = gxrow + ch * hw;
              for (int64_t p = 0; p < hw; ++p) gdst[p] = a * gsrc[p] + bx * xsrc[p] + cc;
            }
          }
          T* pgw = gw.data<T>();
          T* pgb = gb.data<T>();
          for (int64_t ch = 0; ch < c; ++ch) {
            double w_sum = 0, b_sum = 0;
            for (int64_t img = 0; img < b; ++img) {
              w_sum += sgx[static_cast<size_t>(img * c + ch)];
              b_sum += sg[static_cast<size_t>(img * c + ch)];
            }
            pgw[ch] = static_cast<T>(w_sum);
            pgb[ch] = static_cast<T>(b_sum);
          }
        });
        return std::vector<Tensor>{gx, gw, has_bias ? gb : Tensor(), gs};
      });
}

}  // namespace

Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias,
                  double eps) {
  return group_norm_impl("group_norm", x, groups, weight, bias, eps, false, Tensor());
}

Tensor group_norm_silu(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias,
                       double eps) {
  return group_norm_impl("group_norm_silu", x, groups, weight, bias, eps, true, Tensor());
}

Tensor shifted_group_norm_silu(const Tensor& x, const Tensor& shift, int64_t groups,
                               const Tensor& weight, const Tensor& bias, double eps) {
  return group_norm_impl("shifted_group_norm_silu", x, groups, weight, bias, eps, true, shift);
}

}  // namespace starling::ops
