// Fused scaled dot-product attention, causal or bidirectional, without materializing per-head
// copies: heads are read in place from the packed projections.
#pragma once

#include "core/tensor/tensor.h"

namespace starling::ops {

// qkv: (B, T, 3C) packed as [q | k | v], each split into H heads of D = C / H.
// Returns (B, T, C) with heads concatenated: softmax(q k^T / sqrt(D) [+ causal mask]) v.
Tensor attention_packed(const Tensor& qkv, int64_t n_head, bool causal);

// q, k, v: (B, H, T, D) -> (B, H, T, D).
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal);

}  // namespace starling::ops
