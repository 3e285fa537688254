// CPU reductions, accumulated in double for f32 inputs so long sums stay accurate.
#include "core/autograd/autograd.h"
#include "core/ops/device_ops.h"
#include "core/ops/elementwise.h"
#include "core/ops/internal/op_util.h"
#include "core/ops/reduce.h"

namespace starling::ops {

namespace {
using internal::dispatch_float;

Tensor sum_dim_raw(const Tensor& a, int64_t dim, bool keepdim) {
  const int64_t nd = a.dim();
  if (dim < 0) dim += nd;
  STARLING_OP_CHECK(dim >= 0 && dim < nd, "sum", "dim out of range");
  const Tensor c = a.contiguous();
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < dim; ++i) outer *= a.shape()[i];
  for (int64_t i = dim + 1; i < nd; ++i) inner *= a.shape()[i];
  const int64_t n = a.shape()[dim];
  Shape out_shape = a.shape();
  if (keepdim) {
    out_shape[dim] = 1;
  } else {
    out_shape.erase(out_shape.begin() + dim);
  }
  Tensor out = Tensor::zeros(out_shape, a.dtype());
  dispatch_float(a.dtype(), "sum", [&]<typename T>() {
    const T* p = c.data<T>();
    T* o = out.data<T>();
#pragma omp parallel for if (outer * n * inner > (1 << 15))
    for (int64_t i = 0; i < outer; ++i) {
      T* orow = o + i * inner;
      for (int64_t j = 0; j < n; ++j) {
        const T* row = p + (i * n + j) * inner;
        for (int64_t k = 0; k < inner; ++k) orow[k] += row[k];
      }
    }
  });
  return out;
}

Tensor sum_all_raw(const Tensor& a) {
  const Tensor c = a.contiguous();
  Tensor out = Tensor::zeros({}, a.dtype());
  dispatch_float(a.dtype(), "sum", [&]<typename T>() {
    const T* p = c.data<T>();
    const int64_t n = c.numel();
    double acc = 0.0;
#pragma omp parallel for reduction(+ : acc) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) acc += p[i];
    out.data<T>()[0] = static_cast<T>(acc);
  });
  return out;
}

// Broadcast g (reduced shape, keepdim layout) back to `shape`.
Tensor expand_grad(const Tensor& g, const Shape& shape, int64_t dim, double scale) {
  Tensor gk = g.contiguous();
  if (dim >= 0 && gk.dim() + 1 == static_cast<int64_t>(shape.size())) gk = gk.unsqueeze(dim);
  Tensor out = Tensor::zeros(shape, g.dtype());
  autograd::NoGradGuard ng;
  Tensor r = add(out, gk);
  return scale == 1.0 ? r : mul_scalar(r, scale);
}
}  // namespace

Tensor sum(const Tensor& a) {
  Tensor out = sum_all_raw(a);
  if (!autograd::needs_grad({&a})) return out;
  const Shape shape = a.shape();
  return autograd::record(out, "sum", {a}, [shape](const Tensor& g) {
    Tensor r = Tensor::full(shape, g.item(), g.dtype());
    return std::vector<Tensor>{r};
  });
}

Tensor sum(const Tensor& a, int64_t dim, bool keepdim) {
  if (dim < 0) dim += a.dim();
  Tensor out = sum_dim_raw(a, dim, keepdim);
  if (!autograd::needs_grad({&a})) return out;
  const Shape shape = a.shape();
  return autograd::record(out, "sum_dim", {a}, [shape, dim](const Tensor& g) {
    return std::vector<Tensor>{expand_grad(g, shape, dim, 1.0)};
  });
}

Tensor mean(const Tensor& a) {
  if (!a.is_cpu()) return internal::device_ops_for("mean", {&a}).mean(a);
  const double n = static_cast<double>(a.numel());
  return mul_scalar(sum(a), n > 0 ? 1.0 / n : 0.0);
}

Tensor mean(const Tensor& a, int64_t dim, bool keepdim) {
  const double n = static_cast<double>(a.size(dim));
  return mul_scalar(sum(a, dim, keepdim), 1.0 / n);
}

}  // namespace starling::ops
