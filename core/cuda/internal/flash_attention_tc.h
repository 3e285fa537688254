// Flash attention on tensor cores (bf16 operands, fp32 accumulation) for the bf16 precision
// mode: the scores, the probabilities and the gradients are 64 x 64 tiles; every matrix product
// is a warp's 16-row strip times a shared-memory tile (WMMA 16x16x16 on the device), the softmax
// and the elementwise gradient steps run with two lanes per row of the strip. Blocks of 4 warps
// own 64 query rows (forward, dQ) or 64 key rows (dK and dV together).
//
// As flash_attention.h, plain C++ for the host and the device: the kernels in
// core/cuda/flash_attention_cuda.cu call these phase functions between the same barriers that
// tests/core/ops/flash_attention_emulation_test.cc runs them between on the CPU (warp_gemm is
// WMMA on the device and a loop over the same bf16 operands on the host).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/cuda/internal/flash_attention.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <mma.h>
#endif

namespace starling::cuda::flash_tc {

using flash::Ranges;
using flash::Shape;

#if defined(__CUDACC__)
using bf16 = __nv_bfloat16;
STARLING_FLASH_HD bf16 to_bf16(float x) { return __float2bfloat16_rn(x); }
STARLING_FLASH_HD float from_bf16(bf16 x) { return __bfloat162float(x); }
#else
struct bf16 {
  uint16_t bits;
};
inline bf16 to_bf16(float x) {  // round to nearest even, as __float2bfloat16_rn (x finite)
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}
inline float from_bf16(bf16 x) {
  const uint32_t u = static_cast<uint32_t>(x.bits) << 16;
  float f = 0.0f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
#endif

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kBlock = 16 * kWarps;  // rows a block owns (queries or keys)
constexpr int kTile = 64;            // rows of the other side per tile (keys or queries)

// c[16 x n] (+)= a[16 x k] * b[k x n]: a row-major (lda), b row-major (element (k, n) at
// b[k * ldb + n]) or, with kBColMajor, column-major (at b[n * ldb + k]); c fp32 row-major (ldc).
// n and k multiples of 16; pointers 32-byte aligned, lda and ldb multiples of 16.
template <bool kBColMajor>
STARLING_FLASH_HD void warp_gemm(float* c, int ldc, const bf16* a, int lda, const bf16* b, int ldb,
                                 int n, int k, bool accumulate) {
#if defined(__CUDA_ARCH__)
  namespace wmma = nvcuda::wmma;
  using BLayout = typename std::conditional<kBColMajor, wmma::col_major, wmma::row_major>::type;
  for (int n0 = 0; n0 < n; n0 += 16) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    if (accumulate) {
      wmma::load_matrix_sync(acc, c + n0, ldc, wmma::mem_row_major);
    } else {
      wmma::fill_fragment(acc, 0.0f);
    }
    for (int k0 = 0; k0 < k; k0 += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, BLayout> fb;
      wmma::load_matrix_sync(fa, a + k0, lda);
      wmma::load_matrix_sync(fb, kBColMajor ? b + n0 * ldb + k0 : b + k0 * ldb + n0, ldb);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(c + n0, acc, ldc, wmma::mem_row_major);
  }
#else
  for (int r = 0; r < 16; ++r) {
    for (int j = 0; j < n; ++j) {
      float acc = accumulate ? c[r * ldc + j] : 0.0f;
      for (int kk = 0; kk < k; ++kk) {
        const float bv = from_bf16(kBColMajor ? b[j * ldb + kk] : b[kk * ldb + j]);
        acc += from_bf16(a[r * lda + kk]) * bv;
      }
      c[r * ldc + j] = acc;
    }
  }
#endif
}

// Fills this thread's share of a [rows][dp] bf16 tile with rows [r0, r0 + rows) of head bh of
// `base` (a (B, T, width) matrix offset to its q, k, v or dO columns), times `factor`; zeros past
// T and past D.
STARLING_FLASH_HD void load_tile_bf16(bf16* tile, int rows, int dp, const float* base, int width,
                                      const Shape& s, int bh, int r0, float factor, int tid,
                                      int threads) {
  for (int e = tid; e < rows * dp; e += threads) {
    const int r = e / dp, d = e % dp, i = r0 + r;
    tile[e] = to_bf16((i < s.t && d < s.d) ? base[flash::at(s, bh, i, width) + d] * factor : 0.0f);
  }
}

// The next n elements of T at byte offset `off` of base (a shared-memory layout is a run of
// these); a null base only counts the bytes.
template <typename T>
STARLING_FLASH_HD T* carve(char* base, size_t& off, size_t n) {
  T* at = base != nullptr ? reinterpret_cast<T*>(base + off) : nullptr;
  off += n * sizeof(T);
  return at;
}

STARLING_FLASH_HD void zero_f32(float* p, int n, int tid, int threads) {
  for (int e = tid; e < n; e += threads) p[e] = 0.0f;
}

// Lane-pair phases: lane -> (row lane / 2 of the warp's strip, half lane % 2 of the columns).
// Step `it` of a lane visits column half * n + (it + lane) % n of its half of n columns: rows of
// the score and output strips are 64 floats apart (one full turn of the 32 banks), so without
// the stagger all 32 lanes would hit one bank at every step.
STARLING_FLASH_HD int stagger(int it, int lane, int half, int n) {
  return half * n + (it + lane) % n;
}

// ---- forward ----

// Shared memory of the forward kernel, carved from one buffer (fwd_smem_bytes).
struct FwdSmem {
  bf16* q;         // [kBlock][DP], q * scale
  bf16* k;         // [kTile][DP]
  bf16* v;         // [kTile][DP]
  float* s;        // [kBlock][kTile] scores
  bf16* p;         // [kBlock][kTile] probabilities
  float* o;        // [kBlock][DP] unnormalized output
  float* m;        // [kBlock] running max
  float* l;        // [kBlock] running sum
  float* m_next;   // [kBlock] the max after this tile
  float* l_next;   // [kBlock] the sum after this tile
  float* red_max;  // [kThreads] lane partials of the tile's max
  float* red_sum;  // [kThreads] lane partials of the tile's sum
  Ranges* keys;    // [kBlock]
};
// Each lane-pair phase writes only arrays that no lane reads in the same phase (the lanes of a
// warp are not in lockstep); the kernel puts __syncwarp() between phases.

// Every big region's size is a multiple of 128 bytes, so each starts 128-byte aligned when
// `base` is (WMMA wants 32); the small arrays come last. `bytes` receives the layout's size.
STARLING_FLASH_HD FwdSmem fwd_smem(char* base, int dp, size_t* bytes = nullptr) {
  FwdSmem m;
  size_t off = 0;
  m.q = carve<bf16>(base, off, size_t(kBlock) * dp);
  m.k = carve<bf16>(base, off, size_t(kTile) * dp);
  m.v = carve<bf16>(base, off, size_t(kTile) * dp);
  m.s = carve<float>(base, off, size_t(kBlock) * kTile);
  m.p = carve<bf16>(base, off, size_t(kBlock) * kTile);
  m.o = carve<float>(base, off, size_t(kBlock) * dp);
  m.m = carve<float>(base, off, kBlock);
  m.l = carve<float>(base, off, kBlock);
  m.m_next = carve<float>(base, off, kBlock);
  m.l_next = carve<float>(base, off, kBlock);
  m.red_max = carve<float>(base, off, kThreads);
  m.red_sum = carve<float>(base, off, kThreads);
  m.keys = carve<Ranges>(base, off, kBlock);
  if (bytes != nullptr) *bytes = off;
  return m;
}

STARLING_FLASH_HD size_t fwd_smem_bytes(int dp) {
  size_t n = 0;
  fwd_smem(nullptr, dp, &n);
  return n;
}

// Block start: q rows (scaled), zero output, row state (thread t < kBlock sets row t's).
STARLING_FLASH_HD void fwd_begin(const FwdSmem& m, int dp, const float* qkv, const Shape& s, int bh,
                                 int row0, int tid) {
  load_tile_bf16(m.q, kBlock, dp, qkv, 3 * s.c, s, bh, row0, s.scale, tid, kThreads);
  zero_f32(m.o, kBlock * dp, tid, kThreads);
  if (tid < kBlock) {
    const int i = row0 + tid;
    m.m[tid] = -INFINITY;
    m.l[tid] = 0.0f;
    m.keys[tid] = i < s.t ? flash::key_ranges(s, i) : Ranges{0, 0, 0, 0};
  }
}

// Whether thread tid's row reads any key of [j0, j0 + kTile).
STARLING_FLASH_HD bool fwd_needs(const FwdSmem& m, int tid, int j0) {
  return tid < kBlock && m.keys[tid].meets(j0, j0 + kTile);
}

STARLING_FLASH_HD void fwd_load(const FwdSmem& m, int dp, const float* qkv, const Shape& s, int bh,
                                int j0, int tid) {
  load_tile_bf16(m.k, kTile, dp, qkv + s.c, 3 * s.c, s, bh, j0, 1.0f, tid, kThreads);
  load_tile_bf16(m.v, kTile, dp, qkv + 2 * s.c, 3 * s.c, s, bh, j0, 1.0f, tid, kThreads);
}

// Warp w: its 16 rows' scores against the tile, S = (q * scale) k^T.
STARLING_FLASH_HD void fwd_scores(const FwdSmem& m, int dp, int w) {
  warp_gemm<true>(m.s + w * 16 * kTile, kTile, m.q + w * 16 * dp, dp, m.k, dp, kTile, dp, false);
}

// Lane pairs: row r = 16 w + lane / 2, keys half * 32 .. + 32 of the tile. Phase a: partial max.
STARLING_FLASH_HD void fwd_rowmax(const FwdSmem& m, int w, int lane, int j0, int t) {
  const int r = w * 16 + lane / 2, half = lane % 2;
  float mx = -INFINITY;
  for (int it = 0; it < 32; ++it) {
    const int c = stagger(it, lane, half, 32), j = j0 + c;
    if (j < t && m.keys[r].contains(j)) mx = flash::max_f(mx, m.s[r * kTile + c]);
  }
  m.red_max[w * 32 + lane] = mx;
}

// Phase b: the row's new max, this half's probabilities (bf16) and partial sum.
STARLING_FLASH_HD void fwd_probs(const FwdSmem& m, int w, int lane, int j0, int t) {
  const int r = w * 16 + lane / 2, half = lane % 2;
  const float tile_max = flash::max_f(m.red_max[w * 32 + lane], m.red_max[w * 32 + (lane ^ 1)]);
  const float mn = flash::max_f(m.m[r], tile_max);
  float sum = 0.0f;
  for (int it = 0; it < 32; ++it) {
    const int c = stagger(it, lane, half, 32), j = j0 + c;
    float p = 0.0f;
    if (mn != -INFINITY && j < t && m.keys[r].contains(j))
      p = flash::exp_f(m.s[r * kTile + c] - mn);
    const bf16 pb = to_bf16(p);
    m.p[r * kTile + c] = pb;
    sum += from_bf16(pb);  // the sum of what the product with V uses
  }
  m.red_sum[w * 32 + lane] = sum;
  if (half == 0) m.m_next[r] = mn;  // both lanes of the pair computed the same mn
}

// Phase c: the row's rescale factor and running sum; this half of the output row rescaled.
STARLING_FLASH_HD void fwd_rescale(const FwdSmem& m, int dp, int w, int lane) {
  const int r = w * 16 + lane / 2, half = lane % 2;
  const float mn = m.m_next[r];
  const float corr = mn == -INFINITY ? 1.0f : flash::exp_f(m.m[r] - mn);
  // The pair's partials in lane order, so both lanes form the same sum.
  const float sum = m.red_sum[w * 32 + (lane & ~1)] + m.red_sum[w * 32 + (lane | 1)];
  for (int it = 0; it < dp / 2; ++it) m.o[r * dp + stagger(it, lane, half, dp / 2)] *= corr;
  if (half == 0) m.l_next[r] = m.l[r] * corr + sum;
}

// Phase d: the even lane stores the row's state.
STARLING_FLASH_HD void fwd_state(const FwdSmem& m, int w, int lane) {
  const int r = w * 16 + lane / 2;
  if (lane % 2 == 0) {
    m.l[r] = m.l_next[r];
    m.m[r] = m.m_next[r];
  }
}

// Warp w: O += P V for its 16 rows.
STARLING_FLASH_HD void fwd_accumulate(const FwdSmem& m, int dp, int w) {
  warp_gemm<false>(m.o + w * 16 * dp, dp, m.p + w * 16 * kTile, kTile, m.v, dp, dp, kTile, true);
}

// Lane pairs write their half of the row; the even lane writes lse.
STARLING_FLASH_HD void fwd_end(const FwdSmem& m, int dp, float* out, float* lse, const Shape& s,
                               int bh, int row0, int w, int lane) {
  const int r = w * 16 + lane / 2, half = lane % 2, i = row0 + r;
  if (i >= s.t) return;
  const float l = m.l[r];
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  float* o = out + flash::at(s, bh, i, s.c);
  for (int d = half * (dp / 2); d < (half + 1) * (dp / 2); ++d) {
    if (d < s.d) o[d] = m.o[r * dp + d] * inv;
  }
  if (half == 0)
    lse[static_cast<size_t>(bh) * s.t + i] = l > 0.0f ? m.m[r] + flash::log_f(l) : INFINITY;
}

// ---- backward: dK and dV (blocks own keys) ----

struct KvSmem {
  bf16* k;               // [kBlock][DP]
  bf16* v;               // [kBlock][DP]
  float* dk;             // [kBlock][DP]
  float* dv;             // [kBlock][DP]
  bf16* q;               // [kTile][DP], q * scale
  bf16* g;               // [kTile][DP], dO
  float* st;             // [kBlock][kTile]: S^T
  float* dpt;            // [kBlock][kTile]: dP^T
  bf16* pt;              // [kBlock][kTile]
  bf16* dst;             // [kBlock][kTile]
  flash::QueryInfo* qi;  // [kTile]
};

STARLING_FLASH_HD KvSmem kv_smem(char* base, int dp, size_t* bytes = nullptr) {
  KvSmem m;
  size_t off = 0;
  m.k = carve<bf16>(base, off, size_t(kBlock) * dp);
  m.v = carve<bf16>(base, off, size_t(kBlock) * dp);
  m.dk = carve<float>(base, off, size_t(kBlock) * dp);
  m.dv = carve<float>(base, off, size_t(kBlock) * dp);
  m.q = carve<bf16>(base, off, size_t(kTile) * dp);
  m.g = carve<bf16>(base, off, size_t(kTile) * dp);
  m.st = carve<float>(base, off, size_t(kBlock) * kTile);
  m.dpt = carve<float>(base, off, size_t(kBlock) * kTile);
  m.pt = carve<bf16>(base, off, size_t(kBlock) * kTile);
  m.dst = carve<bf16>(base, off, size_t(kBlock) * kTile);
  m.qi = carve<flash::QueryInfo>(base, off, kTile);
  if (bytes != nullptr) *bytes = off;
  return m;
}

STARLING_FLASH_HD size_t kv_smem_bytes(int dp) {
  size_t n = 0;
  kv_smem(nullptr, dp, &n);
  return n;
}

STARLING_FLASH_HD void kv_begin(const KvSmem& m, int dp, const float* qkv, const Shape& s, int bh,
                                int key0, int tid) {
  load_tile_bf16(m.k, kBlock, dp, qkv + s.c, 3 * s.c, s, bh, key0, 1.0f, tid, kThreads);
  load_tile_bf16(m.v, kBlock, dp, qkv + 2 * s.c, 3 * s.c, s, bh, key0, 1.0f, tid, kThreads);
  zero_f32(m.dk, kBlock * dp, tid, kThreads);
  zero_f32(m.dv, kBlock * dp, tid, kThreads);
}

// Thread tid < kTile: query i0 + tid's info, and whether it reads any key of the block.
STARLING_FLASH_HD bool kv_info(const KvSmem& m, const Shape& s, const float* lse,
                               const float* delta, int bh, int i0, int key0, int tid) {
  if (tid >= kTile) return false;
  const flash::QueryInfo qi = flash::query_info(s, lse, delta, bh, i0 + tid);
  m.qi[tid] = qi;
  return qi.keys.meets(key0, key0 + kBlock);
}

STARLING_FLASH_HD void kv_load(const KvSmem& m, int dp, const float* qkv, const float* dout,
                               const Shape& s, int bh, int i0, int tid) {
  load_tile_bf16(m.q, kTile, dp, qkv, 3 * s.c, s, bh, i0, s.scale, tid, kThreads);
  load_tile_bf16(m.g, kTile, dp, dout, s.c, s, bh, i0, 1.0f, tid, kThreads);
}

// Warp w, its 16 keys: S^T = k (q * scale)^T and dP^T = v dO^T against the query tile.
STARLING_FLASH_HD void kv_products(const KvSmem& m, int dp, int w) {
  warp_gemm<true>(m.st + w * 16 * kTile, kTile, m.k + w * 16 * dp, dp, m.q, dp, kTile, dp, false);
  warp_gemm<true>(m.dpt + w * 16 * kTile, kTile, m.v + w * 16 * dp, dp, m.g, dp, kTile, dp, false);
}

// Lane pairs: key row r = 16 w + lane / 2, queries half * 32 .. + 32 of the tile:
// P^T = exp(S^T - lse) where the query reads the key, dS^T = P^T (dP^T - Delta).
STARLING_FLASH_HD void kv_grads(const KvSmem& m, int w, int lane, int key0, int i0, int t) {
  const int r = w * 16 + lane / 2, half = lane % 2, j = key0 + r;
  for (int it = 0; it < 32; ++it) {
    const int c = stagger(it, lane, half, 32);
    float p = 0.0f, ds = 0.0f;
    if (j < t && i0 + c < t && m.qi[c].keys.contains(j)) {
      p = flash::exp_f(m.st[r * kTile + c] - m.qi[c].lse);
      ds = p * (m.dpt[r * kTile + c] - m.qi[c].delta);
    }
    m.pt[r * kTile + c] = to_bf16(p);
    m.dst[r * kTile + c] = to_bf16(ds);
  }
}

// Warp w: dV += P^T dO and dK += dS^T (q * scale) for its 16 keys.
STARLING_FLASH_HD void kv_accumulate(const KvSmem& m, int dp, int w) {
  warp_gemm<false>(m.dv + w * 16 * dp, dp, m.pt + w * 16 * kTile, kTile, m.g, dp, dp, kTile, true);
  warp_gemm<false>(m.dk + w * 16 * dp, dp, m.dst + w * 16 * kTile, kTile, m.q, dp, dp, kTile, true);
}

STARLING_FLASH_HD void kv_end(const KvSmem& m, int dp, float* dqkv, const Shape& s, int bh,
                              int key0, int tid) {
  for (int e = tid; e < kBlock * dp; e += kThreads) {
    const int r = e / dp, d = e % dp, j = key0 + r;
    if (j >= s.t || d >= s.d) continue;
    float* row = dqkv + flash::at(s, bh, j, 3 * s.c);
    row[s.c + d] = m.dk[e];
    row[2 * s.c + d] = m.dv[e];
  }
}

// ---- backward: dQ (blocks own queries) ----

struct DqSmem {
  bf16* q;               // [kBlock][DP], q * scale
  bf16* g;               // [kBlock][DP], dO
  float* dq;             // [kBlock][DP]
  bf16* k;               // [kTile][DP]
  bf16* v;               // [kTile][DP]
  float* s;              // [kBlock][kTile]
  float* dp_;            // [kBlock][kTile]
  bf16* ds;              // [kBlock][kTile]
  flash::QueryInfo* qi;  // [kBlock]
};

STARLING_FLASH_HD DqSmem dq_smem(char* base, int dp, size_t* bytes = nullptr) {
  DqSmem m;
  size_t off = 0;
  m.q = carve<bf16>(base, off, size_t(kBlock) * dp);
  m.g = carve<bf16>(base, off, size_t(kBlock) * dp);
  m.dq = carve<float>(base, off, size_t(kBlock) * dp);
  m.k = carve<bf16>(base, off, size_t(kTile) * dp);
  m.v = carve<bf16>(base, off, size_t(kTile) * dp);
  m.s = carve<float>(base, off, size_t(kBlock) * kTile);
  m.dp_ = carve<float>(base, off, size_t(kBlock) * kTile);
  m.ds = carve<bf16>(base, off, size_t(kBlock) * kTile);
  m.qi = carve<flash::QueryInfo>(base, off, kBlock);
  if (bytes != nullptr) *bytes = off;
  return m;
}

STARLING_FLASH_HD size_t dq_smem_bytes(int dp) {
  size_t n = 0;
  dq_smem(nullptr, dp, &n);
  return n;
}

STARLING_FLASH_HD void dq_begin(const DqSmem& m, int dp, const float* qkv, const float* dout,
                                const float* lse, const float* delta, const Shape& s, int bh,
                                int row0, int tid) {
  load_tile_bf16(m.q, kBlock, dp, qkv, 3 * s.c, s, bh, row0, s.scale, tid, kThreads);
  load_tile_bf16(m.g, kBlock, dp, dout, s.c, s, bh, row0, 1.0f, tid, kThreads);
  zero_f32(m.dq, kBlock * dp, tid, kThreads);
  if (tid < kBlock) m.qi[tid] = flash::query_info(s, lse, delta, bh, row0 + tid);
}

STARLING_FLASH_HD bool dq_needs(const DqSmem& m, int tid, int j0) {
  return tid < kBlock && m.qi[tid].keys.meets(j0, j0 + kTile);
}

STARLING_FLASH_HD void dq_load(const DqSmem& m, int dp, const float* qkv, const Shape& s, int bh,
                               int j0, int tid) {
  load_tile_bf16(m.k, kTile, dp, qkv + s.c, 3 * s.c, s, bh, j0, 1.0f, tid, kThreads);
  load_tile_bf16(m.v, kTile, dp, qkv + 2 * s.c, 3 * s.c, s, bh, j0, 1.0f, tid, kThreads);
}

// Warp w, its 16 queries: S = (q * scale) k^T and dP = dO v^T against the key tile.
STARLING_FLASH_HD void dq_products(const DqSmem& m, int dp, int w) {
  warp_gemm<true>(m.s + w * 16 * kTile, kTile, m.q + w * 16 * dp, dp, m.k, dp, kTile, dp, false);
  warp_gemm<true>(m.dp_ + w * 16 * kTile, kTile, m.g + w * 16 * dp, dp, m.v, dp, kTile, dp, false);
}

// Lane pairs: query row r, keys half * 32 .. + 32: dS = P (dP - Delta).
STARLING_FLASH_HD void dq_grads(const DqSmem& m, int w, int lane, int j0, int row0, int t) {
  const int r = w * 16 + lane / 2, half = lane % 2;
  const flash::QueryInfo& qi = m.qi[r];
  for (int it = 0; it < 32; ++it) {
    const int c = stagger(it, lane, half, 32), j = j0 + c;
    float ds = 0.0f;
    if (row0 + r < t && j < t && qi.keys.contains(j)) {
      const float p = flash::exp_f(m.s[r * kTile + c] - qi.lse);
      ds = p * (m.dp_[r * kTile + c] - qi.delta);
    }
    m.ds[r * kTile + c] = to_bf16(ds);
  }
}

// Warp w: dQ += dS k (the scale is applied at the end).
STARLING_FLASH_HD void dq_accumulate(const DqSmem& m, int dp, int w) {
  warp_gemm<false>(m.dq + w * 16 * dp, dp, m.ds + w * 16 * kTile, kTile, m.k, dp, dp, kTile, true);
}

STARLING_FLASH_HD void dq_end(const DqSmem& m, int dp, float* dqkv, const Shape& s, int bh,
                              int row0, int tid) {
  for (int e = tid; e < kBlock * dp; e += kThreads) {
    const int r = e / dp, d = e % dp, i = row0 + r;
    if (i >= s.t || d >= s.d) continue;
    dqkv[flash::at(s, bh, i, 3 * s.c) + d] = m.dq[e] * s.scale;
  }
}

}  // namespace starling::cuda::flash_tc
