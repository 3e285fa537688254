// CPU concatenation: each part is copied as `outer` blocks of (size along dim) x `inner`.
#include <algorithm>
#include <string>

#include "core/autograd/autograd.h"
#include "core/ops/concat.h"
#include "core/ops/device_ops.h"
#include "core/ops/internal/op_util.h"

namespace starling::ops {

Tensor cat(const std::vector<Tensor>& parts, int64_t dim) {
  const char* op = "cat";
  STARLING_OP_CHECK(!parts.empty(), op, "no tensors to concatenate");
  const Tensor& first = parts[0];
  const int64_t rank = first.dim();
  if (dim < 0) dim += rank;
  STARLING_OP_CHECK(dim >= 0 && dim < rank, op, "dim out of range for " + shape_str(first.shape()));
  Shape out_shape = first.shape();
  out_shape[dim] = 0;
  for (const Tensor& p : parts) {
    bool ok = p.dim() == rank && p.dtype() == first.dtype();
    for (int64_t d = 0; ok && d < rank; ++d) ok = d == dim || p.shape()[d] == first.shape()[d];
    STARLING_OP_CHECK(ok, op,
                      "cannot join " + shape_str(p.shape()) + " to " + shape_str(first.shape()) +
                          " along dim " + std::to_string(dim));
    out_shape[dim] += p.shape()[dim];
  }
  bool device = false;
  for (const Tensor& p : parts) device = device || !p.is_cpu();
  if (device) {
    for (const Tensor& p : parts) internal::device_ops_for(op, {&first, &p});
    return internal::device_ops_for(op, {&first}).cat(parts, dim);
  }
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= out_shape[d];
  for (int64_t d = dim + 1; d < rank; ++d) inner *= out_shape[d];
  const int64_t out_row = out_shape[dim] * inner;
  Tensor out = Tensor::uninitialized(out_shape, first.dtype());
  std::vector<int64_t> sizes;
  internal::dispatch_float(first.dtype(), op, [&]<typename T>() {
    T* po = out.data<T>();
    int64_t at = 0;
    for (const Tensor& p : parts) {
      const Tensor pc = p.contiguous();
      const int64_t row = p.shape()[dim] * inner;
      const T* src = pc.data<T>();
      for (int64_t o = 0; o < outer; ++o) {
        std::copy(src + o * row, src + (o + 1) * row, po + o * out_row + at);
      }
      at += row;
      sizes.push_back(p.shape()[dim]);
    }
  });
  bool any = false;
  for (const Tensor& p : parts) any = any || autograd::needs_grad({&p});
  if (!any) return out;
  return autograd::record(out, op, parts, [sizes, dim](const Tensor& g) {
    std::vector<Tensor> grads;
    int64_t start = 0;
    for (int64_t s : sizes) {
      grads.push_back(g.slice(dim, start, start + s).contiguous());
      start += s;
    }
    return grads;
  });
}

}  // namespace starling::ops
