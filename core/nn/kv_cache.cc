// KvCache: one zero-initialized (B, capacity, C) key and value tensor per layer; the
// matrix-vector linear layer of cached steps.
#include "core/nn/kv_cache.h"

#include <cblas.h>

#include <algorithm>

#include "core/autograd/autograd.h"
#include "core/ops/matmul.h"

namespace starling::nn {

KvCache::KvCache(int64_t n_layer, int64_t batch, int64_t capacity, int64_t n_embd, DType dtype)
    : batch_(batch), capacity_(capacity) {
  layers_.resize(static_cast<size_t>(n_layer));
  for (auto& l : layers_) {
    l.k = Tensor::zeros({batch, capacity, n_embd}, dtype);
    l.v = Tensor::zeros({batch, capacity, n_embd}, dtype);
  }
}

void KvCache::clear() {
  for (auto& l : layers_) l.length = 0;
}

Tensor decode_linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  const DType dt = x.dtype();
  const bool blas_dtype = dt == DType::kF32 || dt == DType::kF64;
  if (x.dim() < 1 || w.dim() != 2 || x.shape().back() != w.shape()[1] || !blas_dtype ||
      w.dtype() != dt || (bias.defined() && bias.dtype() != dt) ||
      autograd::needs_grad({&x, &w, &bias})) {
    return ops::linear(x, w, bias);  // checks shapes and records the graph
  }
  const int64_t in = w.shape()[1], out = w.shape()[0];
  const int64_t rows = in > 0 ? x.numel() / in : 0;
  if (rows < 1 || rows > kDecodeRows) return ops::linear(x, w, bias);
  const Tensor xc = x.contiguous(), wc = w.contiguous();
  const Tensor bc = bias.defined() ? bias.contiguous() : Tensor();
  Shape shape = x.shape();
  shape.back() = out;
  Tensor y = Tensor::uninitialized(shape, dt);
  for (int64_t r = 0; r < rows; ++r) {
    if (dt == DType::kF32) {
      float* yr = y.data<float>() + r * out;
      if (bc.defined()) std::copy_n(bc.data<float>(), out, yr);
      cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(out), static_cast<int>(in), 1.0f,
                  wc.data<float>(), static_cast<int>(in), xc.data<float>() + r * in, 1,
                  bc.defined() ? 1.0f : 0.0f, yr, 1);
    } else {
      double* yr = y.data<double>() + r * out;
      if (bc.defined()) std::copy_n(bc.data<double>(), out, yr);
      cblas_dgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(out), static_cast<int>(in), 1.0,
                  wc.data<double>(), static_cast<int>(in), xc.data<double>() + r * in, 1,
                  bc.defined() ? 1.0 : 0.0, yr, 1);
    }
  }
  return y;
}

}  // namespace starling::nn
