// Linear, Embedding and LayerNorm over the ops in core/ops.
#include "core/nn/layers.h"

#include "core/ops/ops.h"

namespace starling::nn {

Linear::Linear(int64_t in, int64_t out, bool use_bias, Rng& rng, double init_std) {
  weight = register_parameter("weight", Tensor::randn({out, in}, rng, init_std));
  if (use_bias) bias = register_parameter("bias", Tensor::zeros({out}));
}

Tensor Linear::forward(const Tensor& x) const { return ops::linear(x, weight, bias); }

Embedding::Embedding(int64_t num, int64_t dim, Rng& rng, double init_std) {
  weight = register_parameter("weight", Tensor::randn({num, dim}, rng, init_std));
}

Tensor Embedding::forward(const Tensor& ids) const { return ops::embedding(weight, ids); }

LayerNorm::LayerNorm(int64_t dim, bool use_bias, double epsilon) : eps(epsilon) {
  weight = register_parameter("weight", Tensor::ones({dim}));
  if (use_bias) bias = register_parameter("bias", Tensor::zeros({dim}));
}

Tensor LayerNorm::forward(const Tensor& x) const { return ops::layer_norm(x, weight, bias, eps); }

}  // namespace starling::nn
