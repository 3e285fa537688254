// CPU cross-entropy: one pass per row computes log-sum-exp and the loss; the backward pass
// recomputes softmax from the saved logits instead of storing an (N, V) probability table.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/autograd/autograd.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/device_ops.h"
#include "core/ops/internal/op_util.h"
#include "core/ops/matmul.h"

namespace starling::ops {

namespace {

void check_inputs(const Tensor& logits, const Tensor& targets, int32_t ignore_index,
                  const char* op) {
  STARLING_OP_CHECK(logits.dim() == 2, op, "logits must be (N, V)");
  STARLING_OP_CHECK(targets.dtype() == DType::kI32 && targets.numel() == logits.shape()[0], op,
                    "targets must be i32 of shape (N)");
  const int64_t n = logits.shape()[0], v = logits.shape()[1];
  const Tensor tc = targets.contiguous();
  const int32_t* pt = tc.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (pt[i] == ignore_index) continue;
    STARLING_OP_CHECK(
        pt[i] >= 0 && pt[i] < v, op,
        "target " + std::to_string(pt[i]) + " out of range [0, " + std::to_string(v) + ")");
  }
}

// sum_i w[i] * (lse_i - logits[i, t_i]) over non-ignored rows; the gradient of row i is
// g * w[i] * (softmax_i - onehot(t_i)).
Tensor weighted_ce(const Tensor& logits, const Tensor& targets, std::vector<double> w,
                   int32_t ignore_index, const char* op) {
  const int64_t n = logits.shape()[0], v = logits.shape()[1];
  const Tensor lc = logits.contiguous(), tc = targets.contiguous();
  const int32_t* pt = tc.data<int32_t>();
  Tensor lse = Tensor::uninitialized({n}, logits.dtype());
  Tensor out = Tensor::zeros({}, logits.dtype());
  internal::dispatch_float(logits.dtype(), op, [&]<typename T>() {
    const T* p = lc.data<T>();
    T* pl = lse.data<T>();
    double total = 0.0;
#pragma omp parallel for reduction(+ : total) if (n * v > (1 << 14))
    for (int64_t i = 0; i < n; ++i) {
      const T* row = p + i * v;
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < v; ++j) mx = std::max(mx, row[j]);
      T s = 0;
      for (int64_t j = 0; j < v; ++j) s += std::exp(row[j] - mx);
      pl[i] = mx + std::log(s);
      if (pt[i] != ignore_index) total += w[i] * static_cast<double>(pl[i] - row[pt[i]]);
    }
    out.data<T>()[0] = static_cast<T>(total);
  });
  if (!autograd::needs_grad({&logits})) return out;
  return autograd::record(out, op, {logits},
                          [lc, tc, lse, n, v, w = std::move(w), ignore_index, op](const Tensor& g) {
                            Tensor gl = Tensor::uninitialized(lc.shape(), lc.dtype());
                            internal::dispatch_float(lc.dtype(), op, [&]<typename T>() {
                              const double gv = g.item();
                              const T* p = lc.data<T>();
                              const T* pl = lse.data<T>();
                              const int32_t* tgt = tc.data<int32_t>();
                              T* o = gl.data<T>();
#pragma omp parallel for if (n * v > (1 << 14))
                              for (int64_t i = 0; i < n; ++i) {
                                T* orow = o + i * v;
                                if (tgt[i] == ignore_index) {
                                  std::fill(orow, orow + v, T(0));
                                  continue;
                                }
                                const T scale = static_cast<T>(gv * w[i]);
                                const T* row = p + i * v;
                                for (int64_t j = 0; j < v; ++j)
                                  orow[j] = std::exp(row[j] - pl[i]) * scale;
                                orow[tgt[i]] -= scale;
                              }
                            });
                            return std::vector<Tensor>{gl};
                          });
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int32_t ignore_index) {
  if (internal::any_on_device({&logits, &targets})) {
    STARLING_OP_CHECK(logits.dim() == 2, "cross_entropy", "logits must be (N, V)");
    STARLING_OP_CHECK(targets.dtype() == DType::kI32 && targets.numel() == logits.shape()[0],
                      "cross_entropy", "targets must be i32 of shape (N)");
    return internal::device_ops_for("cross_entropy", {&logits, &targets})
        .cross_entropy(logits, targets, ignore_index);
  }
  check_inputs(logits, targets, ignore_index, "cross_entropy");
  const int64_t n = logits.shape()[0];
  const Tensor tc = targets.contiguous();
  const int32_t* pt = tc.data<int32_t>();
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += pt[i] != ignore_index ? 1 : 0;
  std::vector<double> w(static_cast<size_t>(n), count ? 1.0 / static_cast<double>(count) : 0.0);
  return weighted_ce(logits, targets, std::move(w), ignore_index, "cross_entropy");
}

Tensor weighted_cross_entropy(const Tensor& logits, const Tensor& targets,
                              std::span<const double> weights, int32_t ignore_index) {
  check_inputs(logits, targets, ignore_index, "weighted_cross_entropy");
  STARLING_OP_CHECK(static_cast<int64_t>(weights.size()) == logits.shape()[0],
                    "weighted_cross_entropy",
                    "weights must have N = " + std::to_string(logits.shape()[0]) + " values, got " +
                        std::to_string(weights.size()));
  return weighted_ce(logits, targets, std::vector<double>(weights.begin(), weights.end()),
                     ignore_index, "weighted_cross_entropy");
}

Tensor linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets, int64_t chunk,
                            int32_t ignore_index) {
  const char* op = "linear_cross_entropy";
  STARLING_OP_CHECK(x.dim() == 2 && w.dim() == 2 && x.shape()[1] == w.shape()[1], op,
                    "x (N, C) and w (V, C) must agree in C");
  STARLING_OP_CHECK(x.dtype() == w.dtype(), op, "dtype mismatch");
  STARLING_OP_CHECK(chunk > 0, op, "chunk must be positive");
  const int64_t n = x.shape()[0], c = x.shape()[1], v = w.shape()[0];
  STARLING_OP_CHECK(targets.dtype() == DType::kI32 && targets.numel() == n, op,
                    "targets must be i32 of shape (N)");
  const Tensor xc = x.contiguous(), wc = w.contiguous(), tc = targets.contiguous();
  const int32_t* pt = tc.data<int32_t>();
  int64_t counted = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (pt[i] == ignore_index) continue;
    STARLING_OP_CHECK(
        pt[i] >= 0 && pt[i] < v, op,
        "target " + std::to_string(pt[i]) + " out of range [0, " + std::to_string(v) + ")");
    ++counted;
  }
  const int64_t rows = std::min(chunk, std::max<int64_t>(n, 1));
  Tensor lse = Tensor::uninitialized({n}, x.dtype());
  Tensor out = Tensor::zeros({}, x.dtype());
  internal::dispatch_float(x.dtype(), op, [&]<typename T>() {
    std::vector<T> logits(static_cast<size_t>(rows * v));
    T* pl = lse.data<T>();
    double total = 0.0;
    for (int64_t r0 = 0; r0 < n; r0 += rows) {
      const int64_t m = std::min(rows, n - r0);
      internal::gemm<T>(false, true, m, v, c, T(1), xc.data<T>() + r0 * c, c, wc.data<T>(), c, T(0),
                        logits.data(), v);
#pragma omp parallel for reduction(+ : total) if (m * v > (1 << 14))
      for (int64_t i = 0; i < m; ++i) {
        const T* row = logits.data() + i * v;
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < v; ++j) mx = std::max(mx, row[j]);
        T s = 0;
        for (int64_t j = 0; j < v; ++j) s += std::exp(row[j] - mx);
        pl[r0 + i] = mx + std::log(s);
        const int32_t t = pt[r0 + i];
        if (t != ignore_index) total += static_cast<double>(pl[r0 + i] - row[t]);
      }
    }
    out.data<T>()[0] = static_cast<T>(counted > 0 ? total / static_cast<double>(counted) : 0.0);
  });
  if (!autograd::needs_grad({&x, &w})) return out;
  const bool need_x = x.requires_grad(), need_w = w.requires_grad();
  const Tensor dx = xc.detach(), dw = wc.detach();
  return autograd::record(
      out, op, {x, w},
      [dx, dw, tc, lse, n, c, v, rows, counted, ignore_index, need_x, need_w, op](const Tensor& g) {
        std::vector<Tensor> r(2);
        if (counted == 0) return r;
        Tensor gx = need_x ? Tensor::zeros({n, c}, dx.dtype()) : Tensor();
        Tensor gw = need_w ? Tensor::zeros({v, c}, dx.dtype()) : Tensor();
        const int32_t* tgt = tc.data<int32_t>();
        internal::dispatch_float(dx.dtype(), op, [&]<typename T>() {
          const T scale = static_cast<T>(g.item() / static_cast<double>(counted));
          const T* pl = lse.data<T>();
          std::vector<T> d(static_cast<size_t>(rows * v));
          for (int64_t r0 = 0; r0 < n; r0 += rows) {
            const int64_t m = std::min(rows, n - r0);
            internal::gemm<T>(false, true, m, v, c, T(1), dx.data<T>() + r0 * c, c, dw.data<T>(), c,
                              T(0), d.data(), v);
#pragma omp parallel for if (m * v > (1 << 14))
            for (int64_t i = 0; i < m; ++i) {
              T* row = d.data() + i * v;
              const int32_t t = tgt[r0 + i];
              if (t == ignore_index) {
                std::fill(row, row + v, T(0));
                continue;
              }
              const T l = pl[r0 + i];
              for (int64_t j = 0; j < v; ++j) row[j] = scale * std::exp(row[j] - l);
              row[t] -= scale;
            }
            if (need_x) {
              internal::gemm<T>(false, false, m, c, v, T(1), d.data(), v, dw.data<T>(), c, T(0),
                                gx.data<T>() + r0 * c, c);
            }
            if (need_w) {
              internal::gemm<T>(true, false, v, c, m, T(1), d.data(), v, dx.data<T>() + r0 * c, c,
                                T(1), gw.data<T>(), c);
            }
          }
        });
        r[0] = gx;
        r[1] = gw;
        return r;
      });
}

}  // namespace starling::ops
