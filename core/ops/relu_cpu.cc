// CPU ReLU and its backward.
#include "core/autograd/autograd.h"
#include "core/ops/device_ops.h"
#include "core/ops/internal/op_util.h"
#include "core/ops/relu.h"

namespace starling::ops {

Tensor relu(const Tensor& x) {
  if (!x.is_cpu()) return internal::device_ops_for("relu", {&x}).unary(DeviceOps::Unary::kRelu, x);
  const Tensor xc = x.contiguous();
  Tensor out = Tensor::uninitialized(x.shape(), x.dtype());
  internal::dispatch_float(x.dtype(), "relu", [&]<typename T>() {
    const T* p = xc.data<T>();
    T* o = out.data<T>();
    const int64_t n = x.numel();
#pragma omp parallel for simd if (n > (1 << 14))
    for (int64_t i = 0; i < n; ++i) o[i] = p[i] > T(0) ? p[i] : T(0);
  });
  if (!autograd::needs_grad({&x})) return out;
  return autograd::record(out, "relu", {x}, [xc](const Tensor& g) {
    const Tensor gc = g.contiguous();
    Tensor gx = Tensor::uninitialized(xc.shape(), xc.dtype());
    internal::dispatch_float(xc.dtype(), "relu", [&]<typename T>() {
      const T* p = xc.data<T>();
      const T* pg = gc.data<T>();
      T* o = gx.data<T>();
      const int64_t n = xc.numel();
#pragma omp parallel for simd if (n > (1 << 14))
      for (int64_t i = 0; i < n; ++i) o[i] = p[i] > T(0) ? pg[i] : T(0);
    });
    return std::vector<Tensor>{gx};
  });
}

}  // namespace starling::ops
