// CPU cross-entropy: one pass per row computes log-sum-exp and the loss; the backward pass
// recomputes softmax from the saved logits instead of storing an (N, V) probability table.
#include <cmath>
#include <limits>

#include "core/autograd/autograd.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/internal/op_util.h"

namespace starling::ops {

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int32_t ignore_index) {
  STARLING_OP_CHECK(logits.dim() == 2, "cross_entropy", "logits must be (N, V)");
  STARLING_OP_CHECK(targets.dtype() == DType::kI32 && targets.numel() == logits.shape()[0],
                    "cross_entropy", "targets must be i32 of shape (N)");
  const int64_t n = logits.shape()[0], v = logits.shape()[1];
  const Tensor lc = logits.contiguous(), tc = targets.contiguous();
  const int32_t* pt = tc.data<int32_t>();
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (pt[i] == ignore_index) continue;
    STARLING_OP_CHECK(
        pt[i] >= 0 && pt[i] < v, "cross_entropy",
        "target " + std::to_string(pt[i]) + " out of range [0, " + std::to_string(v) + ")");
    ++count;
  }
  Tensor lse = Tensor::uninitialized({n}, logits.dtype());
  Tensor out = Tensor::zeros({}, logits.dtype());
  internal::dispatch_float(logits.dtype(), "cross_entropy", [&]<typename T>() {
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
      if (pt[i] != ignore_index) total += static_cast<double>(pl[i] - row[pt[i]]);
    }
    out.data<T>()[0] = static_cast<T>(count ? total / static_cast<double>(count) : 0.0);
  });
  if (!autograd::needs_grad({&logits})) return out;
  return autograd::record(
      out, "cross_entropy", {logits}, [lc, tc, lse, n, v, count, ignore_index](const Tensor& g) {
        Tensor gl = Tensor::uninitialized(lc.shape(), lc.dtype());
        internal::dispatch_float(lc.dtype(), "cross_entropy", [&]<typename T>() {
          const T scale = count ? static_cast<T>(g.item() / static_cast<double>(count)) : T(0);
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
            const T* row = p + i * v;
            for (int64_t j = 0; j < v; ++j) orow[j] = std::exp(row[j] - pl[i]) * scale;
            orow[tgt[i]] -= scale;
          }
        });
        return std::vector<Tensor>{gl};
      });
}

}  // namespace starling::ops
