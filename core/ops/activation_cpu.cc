// CPU activations with analytic derivatives.
#include <cmath>
#include <type_traits>

#include "core/autograd/autograd.h"
#include "core/ops/activation.h"
#include "core/ops/device_ops.h"
#include "core/ops/internal/fast_math.h"
#include "core/ops/internal/op_util.h"

namespace starling::ops {

namespace {

template <typename T>
T erf_t(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return internal::fast_erff(x);
  } else {
    return std::erf(x);
  }
}

using internal::exp_t;

template <typename T>
T tanh_t(T x) {
  // tanh(x) = 1 - 2 / (exp(2x) + 1), overflow-safe for both signs.
  return 1 - 2 / (exp_t(2 * x) + 1);
}

template <typename T>
T gelu_fwd(T x, GeluApprox a) {
  if (a == GeluApprox::kTanh) {
    const T k = static_cast<T>(0.7978845608028654);  // sqrt(2/pi)
    const T u = k * (x + static_cast<T>(0.044715) * x * x * x);
    return static_cast<T>(0.5) * x * (1 + tanh_t(u));
  }
  return static_cast<T>(0.5) * x * (1 + erf_t(x * static_cast<T>(0.7071067811865476)));
}

template <typename T>
T gelu_bwd(T x, GeluApprox a) {
  if (a == GeluApprox::kTanh) {
    const T k = static_cast<T>(0.7978845608028654);
    const T x3 = x * x * x;
    const T u = k * (x + static_cast<T>(0.044715) * x3);
    const T th = tanh_t(u);
    const T sech2 = 1 - th * th;
    return static_cast<T>(0.5) * (1 + th) +
           static_cast<T>(0.5) * x * sech2 * k * (1 + static_cast<T>(3 * 0.044715) * x * x);
  }
  const T cdf = static_cast<T>(0.5) * (1 + erf_t(x * static_cast<T>(0.7071067811865476)));
  const T pdf = exp_t(static_cast<T>(-0.5) * x * x) * static_cast<T>(0.3989422804014327);
  return cdf + x * pdf;
}

template <typename T>
T silu_fwd(T x) {
  return x / (1 + exp_t(-x));
}

template <typename T>
T silu_bwd(T x) {
  const T s = 1 / (1 + exp_t(-x));
  return s * (1 + x * (1 - s));
}

template <typename Fwd, typename Bwd>
Tensor pointwise(const Tensor& x, const char* name, Fwd fwd, Bwd bwd) {
  const Tensor xc = x.contiguous();
  Tensor out = Tensor::uninitialized(x.shape(), x.dtype());
  internal::dispatch_float(x.dtype(), name, [&]<typename T>() {
    const T* p = xc.data<T>();
    T* o = out.data<T>();
    const int64_t n = x.numel();
#pragma omp parallel for simd if (n > (1 << 14))
    for (int64_t i = 0; i < n; ++i) o[i] = fwd(p[i]);
  });
  if (!autograd::needs_grad({&x})) return out;
  return autograd::record(out, name, {x}, [xc, bwd, name](const Tensor& g) {
    const Tensor gc = g.contiguous();
    Tensor gx = Tensor::uninitialized(xc.shape(), xc.dtype());
    internal::dispatch_float(xc.dtype(), name, [&]<typename T>() {
      const T* p = xc.data<T>();
      const T* pg = gc.data<T>();
      T* o = gx.data<T>();
      const int64_t n = xc.numel();
#pragma omp parallel for simd if (n > (1 << 14))
      for (int64_t i = 0; i < n; ++i) o[i] = pg[i] * bwd(p[i]);
    });
    return std::vector<Tensor>{gx};
  });
}

}  // namespace

Tensor gelu(const Tensor& x, GeluApprox approx) {
  return pointwise(
      x, "gelu", [approx](auto v) { return gelu_fwd(v, approx); },
      [approx](auto v) { return gelu_bwd(v, approx); });
}

Tensor silu(const Tensor& x) {
  if (!x.is_cpu()) return internal::device_ops_for("silu", {&x}).unary(DeviceOps::Unary::kSilu, x);
  return pointwise(
      x, "silu", [](auto v) { return silu_fwd(v); }, [](auto v) { return silu_bwd(v); });
}

}  // namespace starling::ops
