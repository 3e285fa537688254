// Rotary position embeddings (RoPE, Su et al. 2021) in the GPT-NeoX / LLaMA "rotate half"
// convention: within each head of D channels, channel i pairs with channel i + D/2.
#pragma once

#include "core/tensor/tensor.h"

namespace starling::ops {

// x: (B, T, H*D) f32/f64 with D = x.shape[2] / n_head even -> (B, T, H*D). For every head the
// pair (x[i], x[i + D/2]) at position t is rotated by the angle t * base^(-2i/D), i < D/2:
//   y[i]       = x[i] cos - x[i + D/2] sin
//   y[i + D/2] = x[i + D/2] cos + x[i] sin
// Positions count from 0 along T. REQUIRES: base > 0. Differentiable (the backward pass rotates
// the gradient by the opposite angle).
Tensor rope(const Tensor& x, int64_t n_head, double base = 10000.0);

// qkv: (B, T, 3C) packed as [q | k | v] (the layout of attention_packed), H heads of D = C / H,
// D even -> (B, T, 3C) with q and k rotated as rope() does and v copied unchanged. With
// period > 0 the position of row t is t % period (the block-diffusion layout [x_t | x_0] holds
// the same positions twice); REQUIRES period >= 0.
Tensor rope_packed(const Tensor& qkv, int64_t n_head, double base = 10000.0, int64_t period = 0);

}  // namespace starling::ops
