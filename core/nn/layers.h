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

  // Adds a low-rank adapter (LoRA, Hu et al. 2021): forward becomes
  // x W^T + b + (alpha / rank) dropout(x) A^T B^T with A (rank, in) drawn as PyTorch's
  // kaiming_uniform_(a = sqrt(5)) (U(-1/sqrt(in), 1/sqrt(in))) and B (out, rank) zero, so the
  // layer's output is unchanged until B trains. Registers the parameters "lora_A.weight" and
  // "lora_B.weight" (peft's names, less ".default") and freezes weight and bias. `dropout_rng`
  // draws the adapter's dropout masks; it must outlive the layer. REQUIRES: rank > 0, no adapter
  // yet.
  void add_lora(int64_t rank, double alpha, double dropout, Rng& init, Rng& dropout_rng);
  bool has_lora() const { return lora_a.defined(); }
  // W + (alpha / rank) B A: the weight of the plain layer that computes what this one does
  // without dropout (a fresh tensor; the weight itself when there is no adapter).
  Tensor merged_weight() const;

  Tensor weight;
  Tensor bias;    // undefined when built without bias
  Tensor lora_a;  // (rank, in); undefined without an adapter
  Tensor lora_b;  // (out, rank)
  double lora_scale = 0.0;
  double lora_dropout = 0.0;

 private:
  Rng* lora_rng_ = nullptr;
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
