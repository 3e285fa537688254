// Fused scaled dot-product attention, causal or bidirectional, without materializing per-head
// copies: heads are read in place from the packed projections.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/tensor/tensor.h"

namespace starling::ops {

// Which keys each query of a length-n sequence attends to. Every kind lets a query see at most two
// contiguous key ranges (see key_ranges), so the kernels mask rows without a mask tensor.
struct AttnMask {
  enum class Kind : uint8_t {
    kFull,         // every key (bidirectional)
    kCausal,       // keys j <= i
    kBlockCausal,  // blocks of `block` positions: keys in the query's block and every earlier one
    // The block-diffusion training layout (Arriola et al. 2025, BD3-LM): the sequence is
    // [x_t | x_0], two copies of the same n/2 positions split into blocks of `block`. A noisy
    // query of block b sees its own noisy block and the clean blocks before b; a clean query of
    // block b sees the clean blocks up to and including b.
    kBlockDiffusion,
  };
  Kind kind = Kind::kFull;
  int64_t block = 1;

  static AttnMask full() { return {Kind::kFull, 1}; }
  static AttnMask causal() { return {Kind::kCausal, 1}; }
  static AttnMask block_causal(int64_t block) { return {Kind::kBlockCausal, block}; }
  static AttnMask block_diffusion(int64_t block) { return {Kind::kBlockDiffusion, block}; }

  // The keys of query i in a sequence of n: [r[0], r[1]) and [r[2], r[3]) (either may be empty).
  std::array<int64_t, 4> key_ranges(int64_t i, int64_t n) const;
  // An empty string when the mask applies to a sequence of n, else why not (block must divide n,
  // or n / 2 for kBlockDiffusion, whose n must be even).
  std::string check(int64_t n) const;
  // Positions repeat with this period (n / 2 for kBlockDiffusion: both halves are the same
  // positions); 0 when positions run 0..n-1.
  int64_t position_period(int64_t n) const { return kind == Kind::kBlockDiffusion ? n / 2 : 0; }
};

// qkv: (B, T, 3C) packed as [q | k | v], each split into H heads of D = C / H.
// Returns (B, T, C) with heads concatenated: softmax(q k^T / sqrt(D) [+ causal mask]) v.
Tensor attention_packed(const Tensor& qkv, int64_t n_head, bool causal);
// The same with any AttnMask (softmax over each query's allowed keys only).
Tensor attention_packed(const Tensor& qkv, int64_t n_head, const AttnMask& mask);

// q, k, v: (B, H, T, D) -> (B, H, T, D).
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal);

// Inference-time attention of n new rows against a key/value cache (no autograd: qkv_new must not
// require grad). qkv_new: (B, n, 3C) packed [q | k | v] as for attention_packed, H heads of
// D = C / H. k_cache, v_cache: (B, cap, C) contiguous, qkv_new's dtype and device (CPU), rows
// [0, past) holding earlier keys and values. With `rope`, the new rows' q and k are rotated as
// rope_packed does, row i at position pos0 + i (base `rope_base`; D even). The new rows' (rotated)
// keys and values are written to cache rows [past, past + n) (REQUIRES past + n <= cap); whether
// they count afterwards is the caller's choice. New query i attends to cache rows [0, past) and
// to new rows [0, i] when `causal`, all n new rows otherwise. Returns (B, n, C).
struct KvAttnOptions {
  bool causal = true;
  bool rope = false;
  double rope_base = 10000.0;
  int64_t pos0 = 0;  // position of the first new row (RoPE only)
};
Tensor attention_kv(const Tensor& qkv_new, Tensor& k_cache, Tensor& v_cache, int64_t past,
                    int64_t n_head, const KvAttnOptions& opt);

}  // namespace starling::ops
