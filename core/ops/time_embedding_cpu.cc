// CPU sinusoidal time embedding; the backward pass is d/dt sin(t f) = f cos(t f) and
// d/dt cos(t f) = -f sin(t f).
#include <cmath>
#include <string>

#include "core/autograd/autograd.h"
#include "core/ops/device_ops.h"
#include "core/ops/internal/op_util.h"
#include "core/ops/time_embedding.h"

namespace starling::ops {

namespace {
double frequency(int64_t i, int64_t half, double max_period) {
  return half > 1 ? std::exp(-std::log(max_period) * static_cast<double>(i) /
                             static_cast<double>(half - 1))
                  : 1.0;
}
}  // namespace

Tensor timestep_embedding(const Tensor& t, int64_t dim, double max_period) {
  const char* op = "timestep_embedding";
  STARLING_OP_CHECK(t.dim() == 1, op, "times must be (B), got " + shape_str(t.shape()));
  STARLING_OP_CHECK(dim >= 2 && dim % 2 == 0, op,
                    "dim must be even and >= 2, got " + std::to_string(dim));
  if (!t.is_cpu()) {
    return internal::device_ops_for(op, {&t}).timestep_embedding(t, dim, max_period);
  }
  const int64_t b = t.shape()[0], half = dim / 2;
  const Tensor tc = t.contiguous();
  Tensor out = Tensor::uninitialized({b, dim}, t.dtype());
  internal::dispatch_float(t.dtype(), op, [&]<typename T>() {
    const T* pt = tc.data<T>();
    T* po = out.data<T>();
    for (int64_t n = 0; n < b; ++n) {
      for (int64_t i = 0; i < half; ++i) {
        const double a = static_cast<double>(pt[n]) * frequency(i, half, max_period);
        po[n * dim + i] = static_cast<T>(std::sin(a));
        po[n * dim + half + i] = static_cast<T>(std::cos(a));
      }
    }
  });
  if (!autograd::needs_grad({&t})) return out;
  return autograd::record(out, op, {t}, [tc, b, dim, half, max_period](const Tensor& g) {
    const Tensor gc = g.contiguous();
    Tensor gt = Tensor::uninitialized({b}, tc.dtype());
    internal::dispatch_float(tc.dtype(), "timestep_embedding", [&]<typename T>() {
      const T* pt = tc.data<T>();
      const T* pg = gc.data<T>();
      T* pgt = gt.data<T>();
      for (int64_t n = 0; n < b; ++n) {
        double s = 0;
        for (int64_t i = 0; i < half; ++i) {
          const double f = frequency(i, half, max_period);
          const double a = static_cast<double>(pt[n]) * f;
          s += static_cast<double>(pg[n * dim + i]) * f * std::cos(a) -
               static_cast<double>(pg[n * dim + half + i]) * f * std::sin(a);
        }
        pgt[n] = static_cast<T>(s);
      }
    });
    return std::vector<Tensor>{gt};
  });
}

}  // namespace starling::ops
