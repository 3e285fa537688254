// The key/value cache of inference-time attention: per layer, the keys (after RoPE when the
// model uses it) and values of the positions already run, so new rows need not recompute them.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor/tensor.h"

namespace starling::nn {

// One layer's cache: k, v (B, capacity, C); rows [0, length) are valid. Rows past `length` are
// scratch that a cached forward may write without counting them (the block-diffusion sampler's
// noisy block).
struct LayerKv {
  Tensor k;
  Tensor v;
  int64_t length = 0;
};

// The caches of every layer of one model, for B sequences of at most `capacity` positions.
// Not thread-safe; one sampler owns one cache.
class KvCache {
 public:
  KvCache(int64_t n_layer, int64_t batch, int64_t capacity, int64_t n_embd,
          DType dtype = DType::kF32);

  int64_t n_layer() const { return static_cast<int64_t>(layers_.size()); }
  int64_t batch() const { return batch_; }
  int64_t capacity() const { return capacity_; }
  // Rows committed; every layer holds the same number after a whole-model forward.
  int64_t length() const { return layers_.empty() ? 0 : layers_.front().length; }
  // REQUIRES: 0 <= i < n_layer().
  LayerKv& layer(int64_t i) { return layers_[static_cast<size_t>(i)]; }
  // Forgets every row (the storage is kept).
  void clear();

 private:
  std::vector<LayerKv> layers_;
  int64_t batch_ = 0;
  int64_t capacity_ = 0;
};

// y = x W^T + b for the few rows of a cached step: x (..., in), w (out, in), bias (out) or
// undefined -> (..., out). Up to kDecodeRows rows go through one BLAS matrix-vector product per
// row (OpenBLAS's sgemm with one row packs the whole weight first: 2-10x slower at these
// shapes); more rows, other dtypes, or a graph that needs gradients take ops::linear. The
// result equals ops::linear's up to float summation order.
inline constexpr int64_t kDecodeRows = 4;
Tensor decode_linear(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor());

}  // namespace starling::nn
