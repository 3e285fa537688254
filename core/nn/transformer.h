// Transformer pieces shared by GPT and the masked diffusion LM: multi-head self-attention,
// the GELU MLP and the pre-norm block. Names match nanoGPT's (c_attn, c_proj, c_fc, ln_1...).
#pragma once

#include <memory>

#include "core/nn/kv_cache.h"
#include "core/nn/layers.h"
#include "core/ops/attention.h"

namespace starling::nn {

struct TransformerShape {
  int64_t n_embd = 128;  // C
  int64_t n_head = 4;    // H
  int64_t n_layer = 4;   // L (scales the residual projections' init)
  double dropout = 0.0;
  bool bias = false;
  bool causal = true;
  // Rotary position embeddings on q and k of every head (ops::rope_packed, "rotate half"),
  // applied before attention; `rope_base` is the frequency base (10000 in RoFormer / LLaMA).
  bool rope = false;
  double rope_base = 10000.0;
  // The MLP's GELU: exact (erf) or the tanh approximation of GPT-2.
  bool gelu_tanh = false;
};

// x: (B, T, C) -> (B, T, C). `rng` draws dropout masks; it must outlive the module.
class SelfAttention : public Module {
 public:
  SelfAttention(const TransformerShape& s, Rng& init, Rng& dropout_rng);
  // With the shape's own mask (causal or full).
  Tensor forward(const Tensor& x) const;
  // With `mask` instead; RoPE positions follow mask.position_period (both halves of the
  // block-diffusion layout get positions 0..T/2-1).
  Tensor forward(const Tensor& x, const ops::AttnMask& mask) const;
  // Inference only (no dropout, no autograd): x (B, n, C) holds new rows at positions
  // [pos0, pos0 + n) (RoPE rotates them there). Each new row attends to the kv.length cached rows
  // and to the new rows up to itself (`causal`) or all of them (the block-diffusion sampler's
  // block). The new rows' keys and values are written after the cached ones; with `append` they
  // count from then on (kv.length += n), without they are scratch. REQUIRES: kv.length + n <=
  // the cache's capacity.
  Tensor forward_cached(const Tensor& x, LayerKv& kv, int64_t pos0, bool causal, bool append) const;

  std::shared_ptr<Linear> c_attn;  // C -> 3C (q | k | v)
  std::shared_ptr<Linear> c_proj;  // C -> C

 private:
  ops::AttnMask default_mask() const;
  TransformerShape s_;
  Rng* rng_;
};

class Mlp : public Module {
 public:
  Mlp(const TransformerShape& s, Rng& init, Rng& dropout_rng);
  Tensor forward(const Tensor& x) const;  // C -> 4C -> GELU -> C

  std::shared_ptr<Linear> c_fc;
  std::shared_ptr<Linear> c_proj;

 private:
  double dropout_;
  bool gelu_tanh_;
  Rng* rng_;
};

// x + attn(ln_1(x)), then + mlp(ln_2(.)).
class Block : public Module {
 public:
  Block(const TransformerShape& s, Rng& init, Rng& dropout_rng);
  Tensor forward(const Tensor& x) const;
  Tensor forward(const Tensor& x, const ops::AttnMask& mask) const;  // attention with `mask`
  // The block with SelfAttention::forward_cached (inference only).
  Tensor forward_cached(const Tensor& x, LayerKv& kv, int64_t pos0, bool causal, bool append) const;

  std::shared_ptr<LayerNorm> ln_1;
  std::shared_ptr<SelfAttention> attn;
  std::shared_ptr<LayerNorm> ln_2;
  std::shared_ptr<Mlp> mlp;
};

}  // namespace starling::nn
