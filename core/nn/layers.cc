// Linear, Embedding and LayerNorm over the ops in core/ops.
#include "core/nn/layers.h"

#include <cmath>

#include "core/autograd/autograd.h"
#include "core/ops/internal/op_util.h"
#include "core/ops/ops.h"

namespace starling::nn {

Linear::Linear(int64_t in, int64_t out, bool use_bias, Rng& rng, double init_std) {
  weight = register_parameter("weight", Tensor::randn({out, in}, rng, init_std));
  if (use_bias) bias = register_parameter("bias", Tensor::zeros({out}));
}

Tensor Linear::forward(const Tensor& x) const {
  if (!has_lora()) return ops::linear(x, weight, bias);
  if (lora_dropout == 0.0 || !training()) {
    return ops::lora_linear(x, weight, bias, lora_a, lora_b, lora_scale);
  }
  // Dropout on the adapter's input only: the composed ops.
  const Tensor y = ops::linear(x, weight, bias);
  const Tensor xa = ops::dropout(x, lora_dropout, true, *lora_rng_);
  const Tensor low = ops::linear(ops::linear(xa, lora_a), lora_b);
  return ops::add(y, ops::mul_scalar(low, lora_scale));
}

void Linear::add_lora(int64_t rank, double alpha, double dropout, Rng& init, Rng& dropout_rng) {
  STARLING_OP_CHECK(rank > 0 && !has_lora(), "Linear::add_lora", "rank must be positive, once");
  const int64_t in = weight.shape()[1], out = weight.shape()[0];
  freeze();
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  lora_a = register_parameter("lora_A.weight",
                              Tensor::uniform({rank, in}, init, -bound, bound, weight.dtype()));
  lora_b = register_parameter("lora_B.weight", Tensor::zeros({out, rank}, weight.dtype()));
  lora_scale = alpha / static_cast<double>(rank);
  lora_dropout = dropout;
  lora_rng_ = &dropout_rng;
}

Tensor Linear::merged_weight() const {
  if (!has_lora()) return weight;
  autograd::NoGradGuard ng;
  // (out, rank) x (rank, in), then W + scale * that, in the weight's dtype.
  const Tensor ba = ops::matmul(lora_b.detach(), lora_a.detach());
  return ops::add(weight.detach(), ops::mul_scalar(ba, lora_scale)).contiguous();
}

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
