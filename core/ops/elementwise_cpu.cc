// CPU kernels of elementwise arithmetic (OpenMP over elements), with their backward rules.
#include <cmath>
#include <functional>

#include "core/autograd/autograd.h"
#include "core/ops/device_ops.h"
#include "core/ops/elementwise.h"
#include "core/ops/internal/op_util.h"
#include "core/ops/reduce.h"

namespace starling::ops {

namespace internal {

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    STARLING_OP_CHECK(da == db || da == 1 || db == 1, op,
                      "cannot broadcast " + shape_str(a) + " with " + shape_str(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Strides broadcast_strides(const Tensor& t, const Shape& out) {
  Strides s(out.size(), 0);
  const size_t off = out.size() - t.shape().size();
  for (size_t i = 0; i < t.shape().size(); ++i) {
    s[i + off] = t.shape()[i] == 1 ? 0 : t.strides()[i];
  }
  return s;
}

Tensor sum_to_shape(const Tensor& g, const Shape& to) {
  if (g.shape() == to) return g.contiguous();
  Tensor r = g;
  const size_t lead = g.shape().size() - to.size();
  // Sum leading dims away, then dims that were broadcast from 1.
  for (size_t i = 0; i < lead; ++i) r = sum(r, 0, false);
  for (size_t i = 0; i < to.size(); ++i) {
    if (to[i] == 1 && r.shape()[i] != 1) r = sum(r, static_cast<int64_t>(i), true);
  }
  return r.contiguous().view(to);
}

}  // namespace internal

namespace {
using internal::broadcast_shapes;
using internal::broadcast_strides;
using internal::dispatch_float;
using internal::sum_to_shape;

// out[i] = f(a[i], b[i]) with broadcasting.
template <typename T, typename F>
void binary_kernel(const Tensor& a, const Tensor& b, Tensor& out, F f) {
  T* o = out.data<T>();
  const int64_t n = out.numel();
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  if (a.shape() == out.shape() && b.shape() == out.shape() && a.is_contiguous() &&
      b.is_contiguous()) {
#pragma omp parallel for simd if (n > (1 << 15))
    for (int64_t i = 0; i < n; ++i) o[i] = f(pa[i], pb[i]);
    return;
  }
  const Shape& shape = out.shape();
  const int64_t nd = static_cast<int64_t>(shape.size());
  const Strides sa = broadcast_strides(a, shape), sb = broadcast_strides(b, shape);
  const int64_t inner = nd ? shape[nd - 1] : 1;
  const int64_t ia = nd ? sa[nd - 1] : 0, ib = nd ? sb[nd - 1] : 0;
  const int64_t rows = inner ? n / inner : 0;
#pragma omp parallel for if (n > (1 << 15))
  for (int64_t r = 0; r < rows; ++r) {
    int64_t oa = 0, ob = 0, rem = r;
    for (int64_t d = nd - 2; d >= 0; --d) {
      const int64_t idx = rem % shape[d];
      rem /= shape[d];
      oa += idx * sa[d];
      ob += idx * sb[d];
    }
    T* orow = o + r * inner;
    const T* ra = pa + oa;
    const T* rb = pb + ob;
    if (ia == 1 && ib == 1) {
      for (int64_t k = 0; k < inner; ++k) orow[k] = f(ra[k], rb[k]);
    } else if (ia == 1 && ib == 0) {
      const T bv = rb[0];
      for (int64_t k = 0; k < inner; ++k) orow[k] = f(ra[k], bv);
    } else {
      for (int64_t k = 0; k < inner; ++k) orow[k] = f(ra[k * ia], rb[k * ib]);
    }
  }
}

template <typename T, typename F>
Tensor unary_kernel(const Tensor& a, F f) {
  const Tensor c = a.contiguous();
  Tensor out = Tensor::uninitialized(a.shape(), a.dtype());
  const T* p = c.data<T>();
  T* o = out.data<T>();
  const int64_t n = a.numel();
#pragma omp parallel for simd if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) o[i] = f(p[i]);
  return out;
}

enum class BinOp { kAdd, kSub, kMul, kDiv };

Tensor binary_forward(const Tensor& a, const Tensor& b, BinOp op, const char* name) {
  STARLING_OP_CHECK(a.dtype() == b.dtype(), name,
                    std::string("dtype mismatch ") + std::string(dtype_name(a.dtype())) + " vs " +
                        std::string(dtype_name(b.dtype())));
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = Tensor::uninitialized(shape, a.dtype());
  dispatch_float(a.dtype(), name, [&]<typename T>() {
    switch (op) {
      case BinOp::kAdd:
        binary_kernel<T>(a, b, out, [](T x, T y) { return x + y; });
        break;
      case BinOp::kSub:
        binary_kernel<T>(a, b, out, [](T x, T y) { return x - y; });
        break;
      case BinOp::kMul:
        binary_kernel<T>(a, b, out, [](T x, T y) { return x * y; });
        break;
      case BinOp::kDiv:
        binary_kernel<T>(a, b, out, [](T x, T y) { return x / y; });
        break;
    }
  });
  return out;
}

Tensor raw_binary(const Tensor& a, const Tensor& b, BinOp op) {
  return binary_forward(a, b, op, "elementwise");
}

// Devices do not broadcast: both operands of one shape.
Tensor device_binary(DeviceOps::Binary op, const char* name, const Tensor& a, const Tensor& b) {
  STARLING_OP_CHECK(a.shape() == b.shape(), name,
                    "on a device both operands must have one shape, got " + shape_str(a.shape()) +
                        " and " + shape_str(b.shape()));
  return internal::device_ops_for(name, {&a, &b}).binary(op, a, b);
}
}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  if (internal::any_on_device({&a, &b})) return device_binary(DeviceOps::Binary::kAdd, "add", a, b);
  Tensor out = binary_forward(a, b, BinOp::kAdd, "add");
  if (!autograd::needs_grad({&a, &b})) return out;
  const Shape sa = a.shape(), sb = b.shape();
  return autograd::record(out, "add", {a, b}, [sa, sb](const Tensor& g) {
    return std::vector<Tensor>{sum_to_shape(g, sa), sum_to_shape(g, sb)};
  });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  if (internal::any_on_device({&a, &b})) return device_binary(DeviceOps::Binary::kSub, "sub", a, b);
  Tensor out = binary_forward(a, b, BinOp::kSub, "sub");
  if (!autograd::needs_grad({&a, &b})) return out;
  const Shape sa = a.shape(), sb = b.shape();
  return autograd::record(out, "sub", {a, b}, [sa, sb](const Tensor& g) {
    autograd::NoGradGuard ng;
    return std::vector<Tensor>{sum_to_shape(g, sa), sum_to_shape(neg(g), sb)};
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  if (internal::any_on_device({&a, &b})) return device_binary(DeviceOps::Binary::kMul, "mul", a, b);
  Tensor out = binary_forward(a, b, BinOp::kMul, "mul");
  if (!autograd::needs_grad({&a, &b})) return out;
  const Tensor da = a.detach(), db = b.detach();
  return autograd::record(out, "mul", {a, b}, [da, db](const Tensor& g) {
    std::vector<Tensor> r(2);
    if (da.defined()) r[0] = sum_to_shape(raw_binary(g, db, BinOp::kMul), da.shape());
    r[1] = sum_to_shape(raw_binary(g, da, BinOp::kMul), db.shape());
    return r;
  });
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(a, b, BinOp::kDiv, "div");
  if (!autograd::needs_grad({&a, &b})) return out;
  const Tensor da = a.detach(), db = b.detach(), dout = out.detach();
  return autograd::record(out, "div", {a, b}, [da, db, dout](const Tensor& g) {
    Tensor ga = raw_binary(g, db, BinOp::kDiv);
    // d(a/b)/db = -out / b
    Tensor gb = neg(raw_binary(raw_binary(g, dout, BinOp::kMul), db, BinOp::kDiv));
    return std::vector<Tensor>{sum_to_shape(ga, da.shape()), sum_to_shape(gb, db.shape())};
  });
}

Tensor add_scalar(const Tensor& a, double s) {
  Tensor out = dispatch_float(a.dtype(), "add_scalar", [&]<typename T>() {
    const T v = static_cast<T>(s);
    return unary_kernel<T>(a, [v](T x) { return x + v; });
  });
  if (!autograd::needs_grad({&a})) return out;
  return autograd::record(out, "add_scalar", {a},
                          [](const Tensor& g) { return std::vector<Tensor>{g.contiguous()}; });
}

Tensor mul_scalar(const Tensor& a, double s) {
  if (!a.is_cpu()) return internal::device_ops_for("mul_scalar", {&a}).mul_scalar(a, s);
  Tensor out = dispatch_float(a.dtype(), "mul_scalar", [&]<typename T>() {
    const T v = static_cast<T>(s);
    return unary_kernel<T>(a, [v](T x) { return x * v; });
  });
  if (!autograd::needs_grad({&a})) return out;
  return autograd::record(out, "mul_scalar", {a},
                          [s](const Tensor& g) { return std::vector<Tensor>{mul_scalar(g, s)}; });
}

Tensor neg(const Tensor& a) { return mul_scalar(a, -1.0); }

namespace {
// y = f(x) with dy/dx computed from x and y.
template <typename Fwd, typename Bwd>
Tensor unary_op(const Tensor& a, const char* name, Fwd fwd, Bwd bwd) {
  Tensor out = dispatch_float(a.dtype(), name, [&]<typename T>() {
    return unary_kernel<T>(a, [&](T x) { return static_cast<T>(fwd(x)); });
  });
  if (!autograd::needs_grad({&a})) return out;
  const Tensor x = a.detach().contiguous(), y = out.detach();
  return autograd::record(out, name, {a}, [x, y, bwd, name](const Tensor& g) {
    const Tensor gc = g.contiguous();
    Tensor gi = Tensor::uninitialized(x.shape(), x.dtype());
    dispatch_float(x.dtype(), name, [&]<typename T>() {
      const T* px = x.data<T>();
      const T* py = y.data<T>();
      const T* pg = gc.data<T>();
      T* o = gi.data<T>();
      const int64_t n = x.numel();
#pragma omp parallel for if (n > (1 << 15))
      for (int64_t i = 0; i < n; ++i) o[i] = pg[i] * static_cast<T>(bwd(px[i], py[i]));
    });
    return std::vector<Tensor>{gi};
  });
}
}  // namespace

Tensor exp(const Tensor& a) {
  return unary_op(
      a, "exp", [](auto x) { return std::exp(x); }, [](auto, auto y) { return y; });
}

Tensor log(const Tensor& a) {
  return unary_op(
      a, "log", [](auto x) { return std::log(x); }, [](auto x, auto) { return 1 / x; });
}

Tensor sqrt(const Tensor& a) {
  return unary_op(
      a, "sqrt", [](auto x) { return std::sqrt(x); }, [](auto, auto y) { return 0.5 / y; });
}

Tensor tanh(const Tensor& a) {
  return unary_op(
      a, "tanh", [](auto x) { return std::tanh(x); }, [](auto, auto y) { return 1 - y * y; });
}

Tensor square(const Tensor& a) {
  if (!a.is_cpu()) {
    return internal::device_ops_for("square", {&a}).unary(DeviceOps::Unary::kSquare, a);
  }
  return unary_op(
      a, "square", [](auto x) { return x * x; }, [](auto x, auto) { return 2 * x; });
}

Tensor reshape(const Tensor& a, const Shape& shape) {
  Tensor out = a.reshape(shape);
  if (!autograd::needs_grad({&a})) return out;
  // A fresh impl so the view can carry its own grad_fn.
  out = out.detach();
  const Shape in_shape = a.shape();
  return autograd::record(out, "reshape", {a}, [in_shape](const Tensor& g) {
    return std::vector<Tensor>{g.contiguous().view(in_shape)};
  });
}

Tensor transpose(const Tensor& a, int64_t d0, int64_t d1) {
  Tensor out = a.transpose(d0, d1);
  if (!autograd::needs_grad({&a})) return out;
  return autograd::record(out, "transpose", {a}, [d0, d1](const Tensor& g) {
    return std::vector<Tensor>{g.transpose(d0, d1).contiguous()};
  });
}

Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end) {
  Tensor out = a.slice(dim, start, end);
  if (!autograd::needs_grad({&a})) return out;
  const Shape in_shape = a.shape();
  const DType dt = a.dtype();
  return autograd::record(out, "slice", {a}, [in_shape, dt, dim, start, end](const Tensor& g) {
    Tensor gi = Tensor::zeros(in_shape, dt);
    Tensor view = gi.slice(dim, start, end);
    view.copy_from(g);
    return std::vector<Tensor>{gi};
  });
}

Tensor contiguous(const Tensor& a) {
  if (a.is_contiguous()) return a;
  Tensor out = a.contiguous();
  if (!autograd::needs_grad({&a})) return out;
  return autograd::record(out, "contiguous", {a},
                          [](const Tensor& g) { return std::vector<Tensor>{g.contiguous()}; });
}

}  // namespace starling::ops
