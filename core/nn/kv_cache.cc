// KvCache: one zero-initialized (B, capacity, C) key and value tensor per layer.
#include "core/nn/kv_cache.h"

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

}  // namespace starling::nn
