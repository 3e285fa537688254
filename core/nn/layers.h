// Basic layers: Linear, Embedding, LayerNorm. Weights follow PyTorch's layouts and names
// ("weight", "bias"), so state dicts map one to one onto torch.nn modules.
#pragma once

#include "core/nn/module.h"
#include "core/util/rng.h"

namespace starling::nn {

// y = x W^T + b; W: (out, in). Initialized N(0, init_std^2), bias zero.
class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, bool bias, Rng& rng, double init_std = 0.02);
  Tensor forward(const Tensor& x) const;  // x: (..., in) -> (..., out)

  Tensor weight;
  Tensor bias;  // undefined when built without bias
};

// ids (any shape, i32) -> (ids..., C); table (V, C) initialized N(0, init_std^2).
class Embedding : public Module {
 public:
  Embedding(int64_t num, int64_t dim, Rng& rng, double init_std = 0.02);
  Tensor forward(const Tensor& ids) const;

  Tensor weight;
};

// Over the last dim; weight ones, bias zeros (optional).
class LayerNorm : public Module {
 public:
  LayerNorm(int64_t dim, bool bias, double eps = 1e-5);
  Tensor forward(const Tensor& x) const;

  Tensor weight;
  Tensor bias;
  double eps;
};

}  // namespace starling::nn
