// Conv2d and GroupNorm over core/ops/conv.h and core/ops/norm2d.h.
#include "core/nn/conv.h"

#include <cmath>

#include "core/ops/conv.h"
#include "core/ops/norm2d.h"

namespace starling::nn {

Conv2d::Conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride_, int64_t padding_,
               bool use_bias, Rng& rng)
    : stride(stride_), padding(padding_) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(in * kernel * kernel));
  weight =
      register_parameter("weight", Tensor::uniform({out, in, kernel, kernel}, rng, -bound, bound));
  if (use_bias) bias = register_parameter("bias", Tensor::uniform({out}, rng, -bound, bound));
}

Tensor Conv2d::forward(const Tensor& x) const {
  return ops::conv2d(x, weight, bias, stride, padding);
}

Tensor Conv2d::forward(const Tensor& x, const Tensor& residual) const {
  return ops::conv2d(x, weight, bias, stride, padding, residual);
}

GroupNorm::GroupNorm(int64_t groups_, int64_t channels, double eps_) : groups(groups_), eps(eps_) {
  weight = register_parameter("weight", Tensor::ones({channels}));
  bias = register_parameter("bias", Tensor::zeros({channels}));
}

Tensor GroupNorm::forward(const Tensor& x) const {
  return ops::group_norm(x, groups, weight, bias, eps);
}

Tensor GroupNorm::forward_silu(const Tensor& x) const {
  return ops::group_norm_silu(x, groups, weight, bias, eps);
}

Tensor GroupNorm::forward_silu(const Tensor& x, const Tensor& shift) const {
  return ops::shifted_group_norm_silu(x, shift, groups, weight, bias, eps);
}

}  // namespace starling::nn
