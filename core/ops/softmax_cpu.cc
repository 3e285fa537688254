// CPU softmax / log-softmax, max-subtracted for stability.
#include <cmath>
#include <limits>

#include "core/autograd/autograd.h"
#include "core/ops/internal/op_util.h"
#include "core/ops/softmax.h"

namespace starling::ops {

namespace internal {
template <typename T>
void softmax_row(T* row, int64_t n, int64_t valid) {
  T mx = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < valid; ++j) mx = std::max(mx, row[j]);
  T s = 0;
  for (int64_t j = 0; j < valid; ++j) {
    row[j] = std::exp(row[j] - mx);
    s += row[j];
  }
  const T inv = 1 / s;
  for (int64_t j = 0; j < valid; ++j) row[j] *= inv;
  for (int64_t j = valid; j < n; ++j) row[j] = 0;
}
template void softmax_row<float>(float*, int64_t, int64_t);
template void softmax_row<double>(double*, int64_t, int64_t);
}  // namespace internal

namespace {
Tensor softmax_impl(const Tensor& x, bool log) {
  const int64_t n = x.shape().back();
  const int64_t rows = x.numel() / std::max<int64_t>(n, 1);
  Tensor out = x.contiguous().clone();
  internal::dispatch_float(x.dtype(), "softmax", [&]<typename T>() {
    T* p = out.data<T>();
#pragma omp parallel for if (rows * n > (1 << 14))
    for (int64_t r = 0; r < rows; ++r) {
      T* row = p + r * n;
      if (!log) {
        internal::softmax_row(row, n, n);
        continue;
      }
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < n; ++j) mx = std::max(mx, row[j]);
      T s = 0;
      for (int64_t j = 0; j < n; ++j) s += std::exp(row[j] - mx);
      const T lse = mx + std::log(s);
      for (int64_t j = 0; j < n; ++j) row[j] -= lse;
    }
  });
  return out;
}
}  // namespace

Tensor softmax(const Tensor& x) {
  Tensor out = softmax_impl(x, false);
  if (!autograd::needs_grad({&x})) return out;
  const Tensor y = out.detach();
  return autograd::record(out, "softmax", {x}, [y](const Tensor& g) {
    const Tensor gc = g.contiguous();
    Tensor gx = Tensor::uninitialized(y.shape(), y.dtype());
    const int64_t n = y.shape().back(), rows = y.numel() / std::max<int64_t>(n, 1);
    internal::dispatch_float(y.dtype(), "softmax", [&]<typename T>() {
      const T* py = y.data<T>();
      const T* pg = gc.data<T>();
      T* o = gx.data<T>();
      for (int64_t r = 0; r < rows; ++r) {
        T dot = 0;
        for (int64_t j = 0; j < n; ++j) dot += pg[r * n + j] * py[r * n + j];
        for (int64_t j = 0; j < n; ++j) o[r * n + j] = py[r * n + j] * (pg[r * n + j] - dot);
      }
    });
    return std::vector<Tensor>{gx};
  });
}

Tensor log_softmax(const Tensor& x) {
  Tensor out = softmax_impl(x, true);
  if (!autograd::needs_grad({&x})) return out;
  const Tensor y = out.detach();
  return autograd::record(out, "log_softmax", {x}, [y](const Tensor& g) {
    const Tensor gc = g.contiguous();
    Tensor gx = Tensor::uninitialized(y.shape(), y.dtype());
    const int64_t n = y.shape().back(), rows = y.numel() / std::max<int64_t>(n, 1);
    internal::dispatch_float(y.dtype(), "log_softmax", [&]<typename T>() {
      const T* py = y.data<T>();
      const T* pg = gc.data<T>();
      T* o = gx.data<T>();
      for (int64_t r = 0; r < rows; ++r) {
        T s = 0;
        for (int64_t j = 0; j < n; ++j) s += pg[r * n + j];
        for (int64_t j = 0; j < n; ++j) o[r * n + j] = pg[r * n + j] - std::exp(py[r * n + j]) * s;
      }
    });
    return std::vector<Tensor>{gx};
  });
}

}  // namespace starling::ops
