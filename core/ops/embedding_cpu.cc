// CPU embedding: gather forward, scatter-add backward.
#include <cstring>

#include "core/autograd/autograd.h"
#include "core/ops/embedding.h"
#include "core/ops/internal/op_util.h"

namespace starling::ops {

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  STARLING_OP_CHECK(weight.dim() == 2, "embedding", "weight must be (V, C)");
  STARLING_OP_CHECK(ids.dtype() == DType::kI32, "embedding", "ids must be i32");
  const int64_t v = weight.shape()[0], c = weight.shape()[1];
  const Tensor idc = ids.contiguous();
  const Tensor wc = weight.contiguous();
  const int32_t* pid = idc.data<int32_t>();
  const int64_t n = idc.numel();
  for (int64_t i = 0; i < n; ++i) {
    STARLING_OP_CHECK(
        pid[i] >= 0 && pid[i] < v, "embedding",
        "id " + std::to_string(pid[i]) + " out of range [0, " + std::to_string(v) + ")");
  }
  Shape out_shape = ids.shape();
  out_shape.push_back(c);
  Tensor out = Tensor::uninitialized(out_shape, weight.dtype());
  const size_t row_bytes = static_cast<size_t>(c) * dtype_size(weight.dtype());
  const char* pw = static_cast<const char*>(wc.raw_data());
  char* po = static_cast<char*>(out.raw_data());
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(po + i * row_bytes, pw + pid[i] * row_bytes, row_bytes);
  if (!autograd::needs_grad({&weight})) return out;
  const Shape w_shape = weight.shape();
  return autograd::record(out, "embedding", {weight}, [idc, w_shape, c](const Tensor& g) {
    const Tensor gc = g.contiguous();
    Tensor gw = Tensor::zeros(w_shape, g.dtype());
    internal::dispatch_float(g.dtype(), "embedding", [&]<typename T>() {
      const int32_t* p = idc.data<int32_t>();
      const T* pg = gc.data<T>();
      T* o = gw.data<T>();
      const int64_t count = idc.numel();
      for (int64_t i = 0; i < count; ++i) {
        T* row = o + p[i] * c;
        const T* grow = pg + i * c;
        for (int64_t j = 0; j < c; ++j) row[j] += grow[j];
      }
    });
    return std::vector<Tensor>{gw};
  });
}

}  // namespace starling::ops
