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

}  // namespace starling::nn
