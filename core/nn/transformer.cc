// Attention, MLP and block forward passes; GPT-2 style init (residual projections scaled by
// 1/sqrt(2L)).
#include "core/nn/transformer.h"

#include <cmath>

#include "core/ops/ops.h"

namespace starling::nn {

namespace {
double residual_std(const TransformerShape& s) {
  return 0.02 / std::sqrt(2.0 * static_cast<double>(std::max<int64_t>(s.n_layer, 1)));
}
}  // namespace

SelfAttention::SelfAttention(const TransformerShape& s, Rng& init, Rng& dropout_rng)
    : s_(s), rng_(&dropout_rng) {
  c_attn =
      register_module("c_attn", std::make_shared<Linear>(s.n_embd, 3 * s.n_embd, s.bias, init));
  c_proj = register_module(
      "c_proj", std::make_shared<Linear>(s.n_embd, s.n_embd, s.bias, init, residual_std(s)));
}

ops::AttnMask SelfAttention::default_mask() const {
  return s_.causal ? ops::AttnMask::causal() : ops::AttnMask::full();
}

Tensor SelfAttention::forward(const Tensor& x) const { return forward(x, default_mask()); }

Tensor SelfAttention::forward(const Tensor& x, const ops::AttnMask& mask) const {
  Tensor qkv = c_attn->forward(x);  // (B, T, 3C)
  if (s_.rope) {
    qkv = ops::rope_packed(qkv, s_.n_head, s_.rope_base, mask.position_period(x.shape()[1]));
  }
  const Tensor y = ops::attention_packed(qkv, s_.n_head, mask);  // (B, T, C)
  // Attention-probability dropout is folded into residual dropout here (nanoGPT applies both
  // with the same p; with p = 0 the two are identical).
  return ops::dropout(c_proj->forward(y), s_.dropout, training(), *rng_);
}

Tensor SelfAttention::forward_cached(const Tensor& x, LayerKv& kv, int64_t pos0, bool causal,
                                     bool append) const {
  const Tensor qkv = c_attn->forward(x);  // (B, n, 3C)
  ops::KvAttnOptions opt;
  opt.causal = causal;
  opt.rope = s_.rope;
  opt.rope_base = s_.rope_base;
  opt.pos0 = pos0;
  const Tensor y = ops::attention_kv(qkv, kv.k, kv.v, kv.length, s_.n_head, opt);
  if (append) kv.length += x.shape()[1];
  return c_proj->forward(y);
}

Mlp::Mlp(const TransformerShape& s, Rng& init, Rng& dropout_rng)
    : dropout_(s.dropout), gelu_tanh_(s.gelu_tanh), rng_(&dropout_rng) {
  c_fc = register_module("c_fc", std::make_shared<Linear>(s.n_embd, 4 * s.n_embd, s.bias, init));
  c_proj = register_module(
      "c_proj", std::make_shared<Linear>(4 * s.n_embd, s.n_embd, s.bias, init, residual_std(s)));
}

Tensor Mlp::forward(const Tensor& x) const {
  const auto approx = gelu_tanh_ ? ops::GeluApprox::kTanh : ops::GeluApprox::kNone;
  return ops::dropout(c_proj->forward(ops::gelu(c_fc->forward(x), approx)), dropout_, training(),
                      *rng_);
}

Block::Block(const TransformerShape& s, Rng& init, Rng& dropout_rng) {
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(s.n_embd, s.bias));
  attn = register_module("attn", std::make_shared<SelfAttention>(s, init, dropout_rng));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(s.n_embd, s.bias));
  mlp = register_module("mlp", std::make_shared<Mlp>(s, init, dropout_rng));
}

Tensor Block::forward(const Tensor& x) const {
  const Tensor h = ops::add(x, attn->forward(ln_1->forward(x)));
  return ops::add(h, mlp->forward(ln_2->forward(h)));
}

Tensor Block::forward(const Tensor& x, const ops::AttnMask& mask) const {
  const Tensor h = ops::add(x, attn->forward(ln_1->forward(x), mask));
  return ops::add(h, mlp->forward(ln_2->forward(h)));
}

Tensor Block::forward_cached(const Tensor& x, LayerKv& kv, int64_t pos0, bool causal,
                             bool append) const {
  const Tensor h = ops::add(x, attn->forward_cached(ln_1->forward(x), kv, pos0, causal, append));
  return ops::add(h, mlp->forward(ln_2->forward(h)));  // eval mode: no dropout
}

}  // namespace starling::nn
