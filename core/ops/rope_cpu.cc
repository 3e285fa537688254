// CPU rotary embeddings: one (T, D/2) cos/sin table per call (angles in double), rows rotated in
// place of a copy. The backward pass is the same kernel with the sine negated (R^T = R(-theta)).
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd/autograd.h"
#include "core/ops/internal/op_util.h"
#include "core/ops/rope.h"

namespace starling::ops {

namespace {

// cos and sin of t * base^(-2i/D), row-major (T, D/2).
struct RopeTable {
  std::vector<double> cos, sin;
};

RopeTable make_table(int64_t Tn, int64_t D, double base) {
  const int64_t half = D / 2;
  RopeTable tab;
  tab.cos.resize(static_cast<size_t>(Tn * half));
  tab.sin.resize(static_cast<size_t>(Tn * half));
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(D));
    for (int64_t t = 0; t < Tn; ++t) {
      const double a = static_cast<double>(t) * inv_freq;
      tab.cos[static_cast<size_t>(t * half + i)] = std::cos(a);
      tab.sin[static_cast<size_t>(t * half + i)] = std::sin(a);
    }
  }
  return tab;
}

// x, y: (B, T, row) contiguous; the first n_rot_heads heads of D channels of each row are
// rotated (sign = +1) or rotated back (sign = -1), the rest of the row is copied.
template <typename T>
void rope_rows(const T* x, T* y, int64_t B, int64_t Tn, int64_t row, int64_t n_rot_heads, int64_t D,
               int64_t period, const RopeTable& tab, double sign) {
  const int64_t half = D / 2;
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < B * Tn; ++bt) {
    const int64_t t = (bt % Tn) % period;
    const T* xr = x + bt * row;
    T* yr = y + bt * row;
    const double* c = tab.cos.data() + t * half;
    const double* s = tab.sin.data() + t * half;
    for (int64_t h = 0; h < n_rot_heads; ++h) {
      const T* xh = xr + h * D;
      T* yh = yr + h * D;
      for (int64_t i = 0; i < half; ++i) {
        const T ci = static_cast<T>(c[i]), si = static_cast<T>(sign * s[i]);
        const T a = xh[i], b = xh[i + half];
        yh[i] = a * ci - b * si;
        yh[i + half] = b * ci + a * si;
      }
    }
    for (int64_t j = n_rot_heads * D; j < row; ++j) yr[j] = xr[j];
  }
}

// Shared by rope() and rope_packed(): rotates the first `rot_heads` heads of each (B, T) row.
// Positions are t % period (period = T when none is given).
Tensor rope_impl(const Tensor& x, int64_t D, int64_t rot_heads, double base, int64_t period,
                 const char* name) {
  const int64_t B = x.shape()[0], Tn = x.shape()[1], row = x.shape()[2];
  const int64_t per = period > 0 ? std::min(period, Tn) : Tn;
  const Tensor xc = x.contiguous();
  Tensor out = Tensor::uninitialized(x.shape(), x.dtype());
  auto tab = std::make_shared<RopeTable>(make_table(per, D, base));
  internal::dispatch_float(x.dtype(), name, [&]<typename T>() {
    rope_rows<T>(xc.data<T>(), out.data<T>(), B, Tn, row, rot_heads, D, per, *tab, 1.0);
  });
  if (!autograd::needs_grad({&x})) return out;
  return autograd::record(
      out, name, {x}, [tab, B, Tn, row, rot_heads, D, per, name](const Tensor& g) {
        const Tensor gc = g.contiguous();
        Tensor gx = Tensor::uninitialized(gc.shape(), gc.dtype());
        internal::dispatch_float(gc.dtype(), name, [&]<typename T>() {
          rope_rows<T>(gc.data<T>(), gx.data<T>(), B, Tn, row, rot_heads, D, per, *tab, -1.0);
        });
        return std::vector<Tensor>{gx};
      });
}

}  // namespace

Tensor rope(const Tensor& x, int64_t n_head, double base) {
  STARLING_OP_CHECK(x.dim() == 3, "rope", "x must be (B, T, C), got " + shape_str(x.shape()));
  const int64_t C = x.shape()[2];
  STARLING_OP_CHECK(n_head > 0 && C % n_head == 0, "rope",
                    "C = " + std::to_string(C) + " not divisible by n_head");
  const int64_t D = C / n_head;
  STARLING_OP_CHECK(D % 2 == 0, "rope", "head size " + std::to_string(D) + " must be even");
  STARLING_OP_CHECK(base > 0.0 && std::isfinite(base), "rope", "base must be finite and > 0");
  return rope_impl(x, D, n_head, base, 0, "rope");
}

Tensor rope_packed(const Tensor& qkv, int64_t n_head, double base, int64_t period) {
  STARLING_OP_CHECK(qkv.dim() == 3 && qkv.shape()[2] % 3 == 0, "rope_packed",
                    "qkv must be (B, T, 3C), got " + shape_str(qkv.shape()));
  const int64_t C = qkv.shape()[2] / 3;
  STARLING_OP_CHECK(n_head > 0 && C % n_head == 0, "rope_packed",
                    "C = " + std::to_string(C) + " not divisible by n_head");
  const int64_t D = C / n_head;
  STARLING_OP_CHECK(D % 2 == 0, "rope_packed", "head size " + std::to_string(D) + " must be even");
  STARLING_OP_CHECK(base > 0.0 && std::isfinite(base), "rope_packed",
                    "base must be finite and > 0");
  STARLING_OP_CHECK(period >= 0, "rope_packed", "period must be >= 0");
  // q and k are 2H consecutive heads of D channels; v follows untouched.
  return rope_impl(qkv, D, 2 * n_head, base, period, "rope_packed");
}

}  // namespace starling::ops
