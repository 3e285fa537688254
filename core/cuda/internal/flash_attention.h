// Flash-style attention over packed heads, one query (forward, dQ) or one key (dK, dV) per
// thread, keys (queries) streamed through shared-memory tiles of kTile rows: the (B, H, T, T)
// scores are never stored. The forward keeps an online softmax (running max m and sum l per
// query) and writes the output and the log-sum-exp L = m + log(l) of each query row; the
// backward recomputes P = exp(S - L) tile by tile with Delta = rowsum(dO * O) (Dao et al.,
// FlashAttention-2, algorithm 2, with the three gradients in three passes so that no thread
// holds more than three head-sized rows in registers).
//
// This header is plain C++ usable on the host and the device: core/cuda/flash_attention_cuda.cu
// runs these row functions inside its kernels, and tests/core/flash_attention_emulation_test.cc
// runs the same functions on the CPU, block by block and thread by thread between the same
// barriers, against ops::attention in float64. A kernel is only its loop over tiles:
//
//   begin(row) ; for each tile: need = needs(...); if (!any thread needs it) skip;
//                load the tile (every thread its share); barrier; if (need) tile(row); barrier;
//   end(row)
#pragma once

#include <cmath>
#include <cstddef>

#if defined(__CUDACC__)
#define STARLING_FLASH_HD __host__ __device__ __forceinline__
#define STARLING_FLASH_UNROLL _Pragma("unroll")
#else
#define STARLING_FLASH_HD inline
#define STARLING_FLASH_UNROLL
#endif

namespace starling::cuda::flash {

// Threads per block: one query row (forward, dQ) or one key row (dK, dV) each.
constexpr int kRows = 64;
// Rows of K and V (forward, dQ) or of Q and dO (dK, dV) per shared-memory tile.
constexpr int kTile = 32;

// As cuda::AttnMaskKind and ops::AttnMask::Kind.
enum MaskKind : int { kFull = 0, kCausal = 1, kBlockCausal = 2, kBlockDiffusion = 3 };

struct Shape {
  int b = 0, t = 0, c = 0, h = 0, d = 0;  // D = C / H
  float scale = 1.0f;                     // 1 / sqrt(D)
  int mask = kFull;
  int block = 1;  // block length of the block masks
};

// The shape of B sequences of T rows, C channels in H heads, under `mask` (a MaskKind) with
// block length `block` (used by the block masks; below 1 reads as 1). Host only.
inline Shape shape_of(int b, int t, int c, int h, int mask, int block) {
  Shape s;
  s.b = b;
  s.t = t;
  s.c = c;
  s.h = h;
  s.d = c / h;
  s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.d)));
  s.mask = mask;
  s.block = block > 0 ? block : 1;
  return s;
}

STARLING_FLASH_HD float exp_f(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}
STARLING_FLASH_HD float log_f(float x) {
#if defined(__CUDA_ARCH__)
  return logf(x);
#else
  return std::log(x);
#endif
}
STARLING_FLASH_HD float max_f(float a, float b) { return a > b ? a : b; }
STARLING_FLASH_HD int min_i(int a, int b) { return a < b ? a : b; }

// The keys of a query: [r0, r1) and [r2, r3), as ops::AttnMask::key_ranges.
// No default member initializers: the dK and dV kernels keep these in __shared__ memory.
struct Ranges {
  int r0, r1, r2, r3;
  STARLING_FLASH_HD bool contains(int j) const {
    return (j >= r0 && j < r1) || (j >= r2 && j < r3);
  }
  // Whether any key of [lo, hi) is in the ranges.
  STARLING_FLASH_HD bool meets(int lo, int hi) const {
    return (r0 < r1 && r0 < hi && lo < r1) || (r2 < r3 && r2 < hi && lo < r3);
  }
};

STARLING_FLASH_HD Ranges key_ranges(const Shape& s, int i) {
  const int n = s.t;
  switch (s.mask) {
    case kCausal:
      return {0, i + 1, 0, 0};
    case kBlockCausal:
      return {0, min_i(n, (i / s.block + 1) * s.block), 0, 0};
    case kBlockDiffusion: {
      const int half = n / 2;
      if (i < half) {  // noisy query: the clean blocks before its own, then its own noisy block
        const int b0 = (i / s.block) * s.block;
        return {half, half + b0, b0, b0 + s.block};
      }
      return {half, half + ((i - half) / s.block + 1) * s.block, 0, 0};
    }
    default:
      break;
  }
  return {0, n, 0, 0};
}

// Element offset of row i of sequence bh / H in a (B, T, width) matrix, at head bh % H.
STARLING_FLASH_HD size_t at(const Shape& s, int bh, int i, int width) {
  return (static_cast<size_t>(bh / s.h) * s.t + static_cast<size_t>(i)) * width +
         static_cast<size_t>(bh % s.h) * s.d;
}

// Fills this thread's share (elements tid, tid + threads, ...) of a [kTile][DM] tile with rows
// [r0, r0 + kTile) of head bh from `base` (a (B, T, width) matrix, already offset to its q, k,
// v or dO columns); zeros past T and past D.
template <int DM>
STARLING_FLASH_HD void load_tile(float* tile, const float* base, int width, const Shape& s, int bh,
                                 int r0, int tid, int threads) {
  for (int e = tid; e < kTile * DM; e += threads) {
    const int r = e / DM, d = e % DM, i = r0 + r;
    tile[e] = (i < s.t && d < s.d) ? base[at(s, bh, i, width) + d] : 0.0f;
  }
}

// Loads head bh's row i of `base` into regs (zeros past D).
template <int DM>
STARLING_FLASH_HD void load_row(float (&regs)[DM], const float* base, int width, const Shape& s,
                                int bh, int i, float factor) {
  const float* p = base + at(s, bh, i, width);
  STARLING_FLASH_UNROLL
  for (int d = 0; d < DM; ++d) regs[d] = d < s.d ? p[d] * factor : 0.0f;
}

// Four interleaved partial sums: four independent FMA chains instead of one DM long, which a
// few warps per multiprocessor could not keep busy (an FMA's latency is four cycles).
template <int DM>
STARLING_FLASH_HD float dot(const float (&a)[DM], const float* b) {
  static_assert(DM % 4 == 0, "register rows are padded to a multiple of 4");
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  STARLING_FLASH_UNROLL
  for (int d = 0; d < DM; ++d) acc[d % 4] += a[d] * b[d];
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

// ---- forward: one query row ----

template <int DM>
struct FwdRow {
  float q[DM];  // q * scale
  float o[DM];  // unnormalized output
  float m, l;   // running max and sum of exp(s - m)
  Ranges keys;
  int i;
  bool valid;
};

template <int DM>
STARLING_FLASH_HD void fwd_begin(FwdRow<DM>& r, const float* qkv, const Shape& s, int bh, int i) {
  r.i = i;
  r.valid = i < s.t;
  r.m = -INFINITY;
  r.l = 0.0f;
  r.keys = r.valid ? key_ranges(s, i) : Ranges{};
  STARLING_FLASH_UNROLL
  for (int d = 0; d < DM; ++d) r.o[d] = 0.0f;
  if (r.valid) {
    load_row<DM>(r.q, qkv, 3 * s.c, s, bh, i, s.scale);
  } else {
    STARLING_FLASH_UNROLL
    for (int d = 0; d < DM; ++d) r.q[d] = 0.0f;
  }
}

// Whether this query reads any key of [j0, j0 + kTile).
STARLING_FLASH_HD bool needs_keys(const Ranges& keys, bool valid, int j0) {
  return valid && keys.meets(j0, j0 + kTile);
}

// One tile of keys j0.. (ks, vs: [kTile][DM]).
template <int DM>
STARLING_FLASH_HD void fwd_tile(FwdRow<DM>& r, const float* ks, const float* vs, int j0, int t) {
  float sc[kTile];
  float mt = -INFINITY;
  STARLING_FLASH_UNROLL
  for (int c = 0; c < kTile; ++c) {
    const int j = j0 + c;
    float x = -INFINITY;
    if (j < t && r.keys.contains(j)) x = dot<DM>(r.q, ks + c * DM);
    sc[c] = x;
    mt = max_f(mt, x);
  }
  if (mt == -INFINITY) return;
  const float mn = max_f(r.m, mt);
  const float corr = exp_f(r.m - mn);  // 0 on the first tile (m = -inf)
  r.l *= corr;
  STARLING_FLASH_UNROLL
  for (int d = 0; d < DM; ++d) r.o[d] *= corr;
  STARLING_FLASH_UNROLL
  for (int c = 0; c < kTile; ++c) {
    if (sc[c] == -INFINITY) continue;
    const float p = exp_f(sc[c] - mn);
    r.l += p;
    const float* v = vs + c * DM;
    STARLING_FLASH_UNROLL
    for (int d = 0; d < DM; ++d) r.o[d] += p * v[d];
  }
  r.m = mn;
}

// out: (B, T, C); lse: (B, H, T).
template <int DM>
STARLING_FLASH_HD void fwd_end(const FwdRow<DM>& r, float* out, float* lse, const Shape& s,
                               int bh) {
  if (!r.valid) return;
  const float inv = r.l > 0.0f ? 1.0f / r.l : 0.0f;
  float* o = out + at(s, bh, r.i, s.c);
  STARLING_FLASH_UNROLL  // constant indices keep the row in registers
      for (int d = 0; d < DM; ++d) {
    if (d < s.d) o[d] = r.o[d] * inv;
  }
  lse[static_cast<size_t>(bh) * s.t + r.i] = r.l > 0.0f ? r.m + log_f(r.l) : INFINITY;
}

// ---- backward, pass 0: Delta = rowsum(dO * O) per (b, h, query) ----

STARLING_FLASH_HD void delta_row(float* delta, const float* dout, const float* out, const Shape& s,
                                 int bh, int i) {
  const size_t o = at(s, bh, i, s.c);
  float acc = 0.0f;
  for (int d = 0; d < s.d; ++d) acc += dout[o + d] * out[o + d];
  delta[static_cast<size_t>(bh) * s.t + i] = acc;
}

// ---- backward, pass 1: dQ, one query row ----

template <int DM>
struct DqRow {
  float q[DM];  // q * scale
  float g[DM];  // dO
  float dq[DM];
  float lse, delta;
  Ranges keys;
  int i;
  bool valid;
};

template <int DM>
STARLING_FLASH_HD void dq_begin(DqRow<DM>& r, const float* qkv, const float* dout, const float* lse,
                                const float* delta, const Shape& s, int bh, int i) {
  r.i = i;
  r.valid = i < s.t;
  r.keys = r.valid ? key_ranges(s, i) : Ranges{};
  STARLING_FLASH_UNROLL
  for (int d = 0; d < DM; ++d) r.dq[d] = 0.0f;
  if (r.valid) {
    load_row<DM>(r.q, qkv, 3 * s.c, s, bh, i, s.scale);
    load_row<DM>(r.g, dout, s.c, s, bh, i, 1.0f);
    r.lse = lse[static_cast<size_t>(bh) * s.t + i];
    r.delta = delta[static_cast<size_t>(bh) * s.t + i];
  } else {
    STARLING_FLASH_UNROLL
    for (int d = 0; d < DM; ++d) r.q[d] = r.g[d] = 0.0f;
    r.lse = r.delta = 0.0f;
  }
}

// dS_ij = P_ij (dO_i . v_j - Delta_i); dq_i += dS_ij k_j (times scale at the end).
template <int DM>
STARLING_FLASH_HD void dq_tile(DqRow<DM>& r, const float* ks, const float* vs, int j0, int t) {
  for (int c = 0; c < kTile; ++c) {
    const int j = j0 + c;
    if (j >= t || !r.keys.contains(j)) continue;
    const float* k = ks + c * DM;
    const float p = exp_f(dot<DM>(r.q, k) - r.lse);
    const float ds = p * (dot<DM>(r.g, vs + c * DM) - r.delta);
    STARLING_FLASH_UNROLL
    for (int d = 0; d < DM; ++d) r.dq[d] += ds * k[d];
  }
}

// Writes dq into the q columns of dqkv: (B, T, 3C).
template <int DM>
STARLING_FLASH_HD void dq_end(const DqRow<DM>& r, float* dqkv, const Shape& s, int bh) {
  if (!r.valid) return;
  float* o = dqkv + at(s, bh, r.i, 3 * s.c);
  STARLING_FLASH_UNROLL
  for (int d = 0; d < DM; ++d) {
    if (d < s.d) o[d] = r.dq[d] * s.scale;
  }
}

// ---- backward, passes 2 and 3: dV (kDk false) or dK (kDk true), one key row ----

// Per query of a tile, in shared memory beside the Q and dO tiles.
struct QueryInfo {
  Ranges keys;
  float lse, delta;
};

// Query i's info (an invalid i reads no key).
STARLING_FLASH_HD QueryInfo query_info(const Shape& s, const float* lse, const float* delta, int bh,
                                       int i) {
  QueryInfo q{};
  if (i < s.t) {
    q.keys = key_ranges(s, i);
    q.lse = lse[static_cast<size_t>(bh) * s.t + i];
    q.delta = delta[static_cast<size_t>(bh) * s.t + i];
  } else {
    q.lse = q.delta = 0.0f;
  }
  return q;
}

template <int DM>
struct KvRow {
  float k[DM];
  float v[DM];  // read by the dK pass only
  float acc[DM];
  int j;
  bool valid;
};

template <int DM, bool kDk>
STARLING_FLASH_HD void kv_begin(KvRow<DM>& r, const float* qkv, const Shape& s, int bh, int j) {
  r.j = j;
  r.valid = j < s.t;
  STARLING_FLASH_UNROLL
  for (int d = 0; d < DM; ++d) r.acc[d] = r.v[d] = r.k[d] = 0.0f;
  if (!r.valid) return;
  load_row<DM>(r.k, qkv + s.c, 3 * s.c, s, bh, j, 1.0f);
  if (kDk) load_row<DM>(r.v, qkv + 2 * s.c, 3 * s.c, s, bh, j, 1.0f);
}

// A query tile's rows meet the keys [j_lo, j_hi) of this block: does query `info` read any?
STARLING_FLASH_HD bool needs_queries(const QueryInfo& info, int j_lo, int j_hi) {
  return info.keys.meets(j_lo, j_hi);
}

// qs: [kTile][DM] of q * scale, gs: [kTile][DM] of dO, info: [kTile] for queries i0...
template <int DM, bool kDk>
STARLING_FLASH_HD void kv_tile(KvRow<DM>& r, const float* qs, const float* gs,
                               const QueryInfo* info, int i0, int t) {
  if (!r.valid) return;
  for (int c = 0; c < kTile; ++c) {
    if (i0 + c >= t || !info[c].keys.contains(r.j)) continue;
    const float* q = qs + c * DM;
    const float* g = gs + c * DM;
    const float p = exp_f(dot<DM>(r.k, q) - info[c].lse);
    if (kDk) {
      const float ds = p * (dot<DM>(r.v, g) - info[c].delta);
      STARLING_FLASH_UNROLL
      for (int d = 0; d < DM; ++d) r.acc[d] += ds * q[d];  // q already carries the scale
    } else {
      STARLING_FLASH_UNROLL
      for (int d = 0; d < DM; ++d) r.acc[d] += p * g[d];
    }
  }
}

// Writes dk or dv into its columns of dqkv.
template <int DM, bool kDk>
STARLING_FLASH_HD void kv_end(const KvRow<DM>& r, float* dqkv, const Shape& s, int bh) {
  if (!r.valid) return;
  float* o = dqkv + at(s, bh, r.j, 3 * s.c) + (kDk ? s.c : 2 * s.c);
  STARLING_FLASH_UNROLL
  for (int d = 0; d < DM; ++d) {
    if (d < s.d) o[d] = r.acc[d];
  }
}

// Scales a loaded Q tile by `scale` (the dK and dV passes read q * scale, as the forward).
template <int DM>
STARLING_FLASH_HD void scale_tile(float* tile, float scale, int tid, int threads) {
  for (int e = tid; e < kTile * DM; e += threads) tile[e] *= scale;
}

}  // namespace starling::cuda::flash
