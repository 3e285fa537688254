// CPU dropout: the mask is drawn serially (deterministic for a seed) and kept for backward.
#include "core/autograd/autograd.h"
#include "core/ops/device_ops.h"
#include "core/ops/dropout.h"
#include "core/ops/elementwise.h"
#include "core/ops/internal/op_util.h"

namespace starling::ops {

Tensor dropout(const Tensor& x, double p, bool training, Rng& rng) {
  STARLING_OP_CHECK(p >= 0.0 && p < 1.0, "dropout", "p must be in [0, 1)");
  if (!training || p == 0.0) return x;
  Tensor mask = Tensor::uninitialized(x.shape(), x.dtype());
  const double keep_scale = 1.0 / (1.0 - p);
  internal::dispatch_float(x.dtype(), "dropout", [&]<typename T>() {
    T* m = mask.data<T>();
    const int64_t n = mask.numel();
    for (int64_t i = 0; i < n; ++i) m[i] = rng.uniform() < p ? T(0) : static_cast<T>(keep_scale);
  });
  // On a device the mask is drawn on the host from the same stream (the same mask as a CPU run)
  // and multiplied there.
  if (!x.is_cpu()) mask = *mask.to(x.device());
  return mul(x, mask);
}

}  // namespace starling::ops
