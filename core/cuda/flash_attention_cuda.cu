// Flash-style attention kernels (core/cuda/internal/flash_attention.h holds the arithmetic, shared
// with the CPU emulation test): the forward, Delta, dQ, dV and dK passes, each a grid of
// (B * H, ceil(T / kRows)) blocks of kRows threads, one row per thread, K/V (or Q/dO) tiles in
// shared memory. Head sizes up to 128, dispatched on DM in {16, 32, 64, 128}.
#include <type_traits>

#include "core/cuda/check.h"
#include "core/cuda/internal/flash_attention.h"
#include "core/cuda/internal/flash_attention_tc.h"
#include "core/cuda/kernels.h"

namespace starling::cuda {
namespace {

using flash::kRows;
using flash::kTile;

template <int DM>
__global__ void __launch_bounds__(kRows)
    flash_forward_kernel(float* out, float* lse, const float* qkv, flash::Shape s) {
  __shared__ __align__(16) float ks[kTile * DM];
  __shared__ __align__(16) float vs[kTile * DM];
  const int bh = blockIdx.x, tid = threadIdx.x;
  flash::FwdRow<DM> r;
  flash::fwd_begin<DM>(r, qkv, s, bh, blockIdx.y * kRows + tid);
  for (int j0 = 0; j0 < s.t; j0 += kTile) {
    const bool need = flash::needs_keys(r.keys, r.valid, j0);
    if (!__syncthreads_or(need)) continue;
    flash::load_tile<DM>(ks, qkv + s.c, 3 * s.c, s, bh, j0, tid, kRows);
    flash::load_tile<DM>(vs, qkv + 2 * s.c, 3 * s.c, s, bh, j0, tid, kRows);
    __syncthreads();
    if (need) flash::fwd_tile<DM>(r, ks, vs, j0, s.t);
    __syncthreads();
  }
  flash::fwd_end<DM>(r, out, lse, s, bh);
}

__global__ void flash_delta_kernel(float* delta, const float* dout, const float* out,
                                   flash::Shape s) {
  const int bh = blockIdx.x, i = blockIdx.y * blockDim.x + threadIdx.x;
  if (i < s.t) flash::delta_row(delta, dout, out, s, bh, i);
}

template <int DM>
__global__ void __launch_bounds__(kRows)
    flash_dq_kernel(float* dqkv, const float* qkv, const float* dout, const float* lse,
                    const float* delta, flash::Shape s) {
  __shared__ __align__(16) float ks[kTile * DM];
  __shared__ __align__(16) float vs[kTile * DM];
  const int bh = blockIdx.x, tid = threadIdx.x;
  flash::DqRow<DM> r;
  flash::dq_begin<DM>(r, qkv, dout, lse, delta, s, bh, blockIdx.y * kRows + tid);
  for (int j0 = 0; j0 < s.t; j0 += kTile) {
    const bool need = flash::needs_keys(r.keys, r.valid, j0);
    if (!__syncthreads_or(need)) continue;
    flash::load_tile<DM>(ks, qkv + s.c, 3 * s.c, s, bh, j0, tid, kRows);
    flash::load_tile<DM>(vs, qkv + 2 * s.c, 3 * s.c, s, bh, j0, tid, kRows);
    __syncthreads();
    if (need) flash::dq_tile<DM>(r, ks, vs, j0, s.t);
    __syncthreads();
  }
  flash::dq_end<DM>(r, dqkv, s, bh);
}

template <int DM, bool kDk>
__global__ void __launch_bounds__(kRows)
    flash_kv_kernel(float* dqkv, const float* qkv, const float* dout, const float* lse,
                    const float* delta, flash::Shape s) {
  __shared__ __align__(16) float qs[kTile * DM];
  __shared__ __align__(16) float gs[kTile * DM];
  __shared__ flash::QueryInfo info[kTile];
  const int bh = blockIdx.x, tid = threadIdx.x;
  const int j_lo = blockIdx.y * kRows, j_hi = min(s.t, j_lo + kRows);
  flash::KvRow<DM> r;
  flash::kv_begin<DM, kDk>(r, qkv, s, bh, j_lo + tid);
  for (int i0 = 0; i0 < s.t; i0 += kTile) {
    flash::QueryInfo mine{};
    bool need = false;
    if (tid < kTile) {
      mine = flash::query_info(s, lse, delta, bh, i0 + tid);
      need = flash::needs_queries(mine, j_lo, j_hi);
    }
    if (!__syncthreads_or(need)) continue;
    if (tid < kTile) info[tid] = mine;
    flash::load_tile<DM>(qs, qkv, 3 * s.c, s, bh, i0, tid, kRows);
    flash::load_tile<DM>(gs, dout, s.c, s, bh, i0, tid, kRows);
    __syncthreads();
    flash::scale_tile<DM>(qs, s.scale, tid, kRows);
    __syncthreads();
    flash::kv_tile<DM, kDk>(r, qs, gs, info, i0, s.t);
    __syncthreads();
  }
  flash::kv_end<DM, kDk>(r, dqkv, s, bh);
}

// Calls f(std::integral_constant<int, W>{}) with W the register / tile width for head size d:
// 16, 32, 64 or 128 (flash_attention_supported: d <= 128).
template <typename F>
void by_width(int d, F&& f) {
  if (d <= 16) {
    f(std::integral_constant<int, 16>{});
  } else if (d <= 32) {
    f(std::integral_constant<int, 32>{});
  } else if (d <= 64) {
    f(std::integral_constant<int, 64>{});
  } else {
    f(std::integral_constant<int, 128>{});
  }
}

void launch_delta(float* delta, const float* dout, const float* out, const flash::Shape& s,
                  cudaStream_t stream) {
  flash_delta_kernel<<<dim3(static_cast<unsigned>(s.b * s.h),
                            static_cast<unsigned>((s.t + 127) / 128)),
                       128, 0, stream>>>(delta, dout, out, s);
  STARLING_CUDA_CHECK_LAUNCH();
}

dim3 grid_of(const flash::Shape& s) {
  return dim3(static_cast<unsigned>(s.b * s.h), static_cast<unsigned>((s.t + kRows - 1) / kRows));
}

template <int DM>
void forward_dm(float* out, float* lse, const float* qkv, const flash::Shape& s,
                cudaStream_t stream) {
  flash_forward_kernel<DM><<<grid_of(s), kRows, 0, stream>>>(out, lse, qkv, s);
  STARLING_CUDA_CHECK_LAUNCH();
}

template <int DM>
void backward_dm(float* dqkv, const float* qkv, const float* dout, const float* lse,
                 const float* delta, const flash::Shape& s, cudaStream_t stream) {
  flash_dq_kernel<DM><<<grid_of(s), kRows, 0, stream>>>(dqkv, qkv, dout, lse, delta, s);
  STARLING_CUDA_CHECK_LAUNCH();
  flash_kv_kernel<DM, false><<<grid_of(s), kRows, 0, stream>>>(dqkv, qkv, dout, lse, delta, s);
  STARLING_CUDA_CHECK_LAUNCH();
  flash_kv_kernel<DM, true><<<grid_of(s), kRows, 0, stream>>>(dqkv, qkv, dout, lse, delta, s);
  STARLING_CUDA_CHECK_LAUNCH();
}

// ---- tensor cores (bf16 operands, fp32 accumulation): core/cuda/internal/flash_attention_tc.h
// ----

namespace tc = flash_tc;

template <int DP>
__global__ void __launch_bounds__(tc::kThreads)
    tc_forward_kernel(float* out, float* lse, const float* qkv, flash::Shape s) {
  extern __shared__ __align__(128) char smem[];
  const tc::FwdSmem m = tc::fwd_smem(smem, DP);
  const int bh = blockIdx.x, row0 = blockIdx.y * tc::kBlock, tid = threadIdx.x;
  const int w = tid / 32, lane = tid % 32;
  tc::fwd_begin(m, DP, qkv, s, bh, row0, tid);
  __syncthreads();
  for (int j0 = 0; j0 < s.t; j0 += tc::kTile) {
    if (!__syncthreads_or(tc::fwd_needs(m, tid, j0))) continue;
    tc::fwd_load(m, DP, qkv, s, bh, j0, tid);
    __syncthreads();
    tc::fwd_scores(m, DP, w);
    __syncwarp();
    tc::fwd_rowmax(m, w, lane, j0, s.t);
    __syncwarp();
    tc::fwd_probs(m, w, lane, j0, s.t);
    __syncwarp();
    tc::fwd_rescale(m, DP, w, lane);
    __syncwarp();
    tc::fwd_state(m, w, lane);
    __syncwarp();
    tc::fwd_accumulate(m, DP, w);
    __syncthreads();  // k and v are reloaded next
  }
  __syncthreads();
  tc::fwd_end(m, DP, out, lse, s, bh, row0, w, lane);
}

template <int DP>
__global__ void __launch_bounds__(tc::kThreads)
    tc_kv_kernel(float* dqkv, const float* qkv, const float* dout, const float* lse,
                 const float* delta, flash::Shape s) {
  extern __shared__ __align__(128) char smem[];
  const tc::KvSmem m = tc::kv_smem(smem, DP);
  const int bh = blockIdx.x, key0 = blockIdx.y * tc::kBlock, tid = threadIdx.x;
  const int w = tid / 32, lane = tid % 32;
  tc::kv_begin(m, DP, qkv, s, bh, key0, tid);
  for (int i0 = 0; i0 < s.t; i0 += tc::kTile) {
    __syncthreads();  // the last tile's readers of qi, q and g are done
    if (!__syncthreads_or(tc::kv_info(m, s, lse, delta, bh, i0, key0, tid))) continue;
    tc::kv_load(m, DP, qkv, dout, s, bh, i0, tid);
    __syncthreads();
    tc::kv_products(m, DP, w);
    __syncwarp();
    tc::kv_grads(m, w, lane, key0, i0, s.t);
    __syncwarp();
    tc::kv_accumulate(m, DP, w);
  }
  __syncthreads();
  tc::kv_end(m, DP, dqkv, s, bh, key0, tid);
}

template <int DP>
__global__ void __launch_bounds__(tc::kThreads)
    tc_dq_kernel(float* dqkv, const float* qkv, const float* dout, const float* lse,
                 const float* delta, flash::Shape s) {
  extern __shared__ __align__(128) char smem[];
  const tc::DqSmem m = tc::dq_smem(smem, DP);
  const int bh = blockIdx.x, row0 = blockIdx.y * tc::kBlock, tid = threadIdx.x;
  const int w = tid / 32, lane = tid % 32;
  tc::dq_begin(m, DP, qkv, dout, lse, delta, s, bh, row0, tid);
  for (int j0 = 0; j0 < s.t; j0 += tc::kTile) {
    __syncthreads();  // qi is written; the last tile's readers of k and v are done
    if (!__syncthreads_or(tc::dq_needs(m, tid, j0))) continue;
    tc::dq_load(m, DP, qkv, s, bh, j0, tid);
    __syncthreads();
    tc::dq_products(m, DP, w);
    __syncwarp();
    tc::dq_grads(m, w, lane, j0, row0, s.t);
    __syncwarp();
    tc::dq_accumulate(m, DP, w);
  }
  __syncthreads();
  tc::dq_end(m, DP, dqkv, s, bh, row0, tid);
}

dim3 tc_grid(const flash::Shape& s) {
  return dim3(static_cast<unsigned>(s.b * s.h),
              static_cast<unsigned>((s.t + tc::kBlock - 1) / tc::kBlock));
}

// Dynamic shared memory past 48 KB must be allowed per kernel.
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  STARLING_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes)));
}

template <int DP>
void tc_forward_dp(float* out, float* lse, const float* qkv, const flash::Shape& s,
                   cudaStream_t stream) {
  const size_t bytes = tc::fwd_smem_bytes(DP);
  allow_smem(tc_forward_kernel<DP>, bytes);
  tc_forward_kernel<DP><<<tc_grid(s), tc::kThreads, bytes, stream>>>(out, lse, qkv, s);
  STARLING_CUDA_CHECK_LAUNCH();
}

template <int DP>
void tc_backward_dp(float* dqkv, const float* qkv, const float* dout, const float* lse,
                    const float* delta, const flash::Shape& s, cudaStream_t stream) {
  const size_t dq_bytes = tc::dq_smem_bytes(DP), kv_bytes = tc::kv_smem_bytes(DP);
  allow_smem(tc_dq_kernel<DP>, dq_bytes);
  allow_smem(tc_kv_kernel<DP>, kv_bytes);
  tc_dq_kernel<DP><<<tc_grid(s), tc::kThreads, dq_bytes, stream>>>(dqkv, qkv, dout, lse, delta, s);
  STARLING_CUDA_CHECK_LAUNCH();
  tc_kv_kernel<DP><<<tc_grid(s), tc::kThreads, kv_bytes, stream>>>(dqkv, qkv, dout, lse, delta, s);
  STARLING_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool flash_attention_supported(int head_dim) { return head_dim >= 1 && head_dim <= 128; }

namespace {

// Both families: the fp32 kernels, or with `tensor_cores` the bf16 WMMA ones.
void forward(bool tensor_cores, float* out, float* lse, const float* qkv, int b, int t, int c,
             int h, AttnMaskKind mask, int block, cudaStream_t stream) {
  if (b == 0 || t == 0) return;
  const flash::Shape s = flash::shape_of(b, t, c, h, static_cast<int>(mask), block);
  by_width(s.d, [&](auto w) {
    constexpr int W = decltype(w)::value;
    if (tensor_cores) {
      tc_forward_dp<W>(out, lse, qkv, s, stream);
    } else {
      forward_dm<W>(out, lse, qkv, s, stream);
    }
  });
}

void backward(bool tensor_cores, float* dqkv, float* delta, const float* dout, const float* qkv,
              const float* out, const float* lse, int b, int t, int c, int h, AttnMaskKind mask,
              int block, cudaStream_t stream) {
  if (b == 0 || t == 0) return;
  const flash::Shape s = flash::shape_of(b, t, c, h, static_cast<int>(mask), block);
  launch_delta(delta, dout, out, s, stream);
  by_width(s.d, [&](auto w) {
    constexpr int W = decltype(w)::value;
    if (tensor_cores) {
      tc_backward_dp<W>(dqkv, qkv, dout, lse, delta, s, stream);
    } else {
      backward_dm<W>(dqkv, qkv, dout, lse, delta, s, stream);
    }
  });
}

}  // namespace

void flash_attention_forward(float* out, float* lse, const float* qkv, int b, int t, int c, int h,
                             AttnMaskKind mask, int block, cudaStream_t stream) {
  forward(false, out, lse, qkv, b, t, c, h, mask, block, stream);
}

void flash_attention_backward(float* dqkv, float* delta, const float* dout, const float* qkv,
                              const float* out, const float* lse, int b, int t, int c, int h,
                              AttnMaskKind mask, int block, cudaStream_t stream) {
  backward(false, dqkv, delta, dout, qkv, out, lse, b, t, c, h, mask, block, stream);
}

void flash_attention_forward_bf16(float* out, float* lse, const float* qkv, int b, int t, int c,
                                  int h, AttnMaskKind mask, int block, cudaStream_t stream) {
  forward(true, out, lse, qkv, b, t, c, h, mask, block, stream);
}

void flash_attention_backward_bf16(float* dqkv, float* delta, const float* dout, const float* qkv,
                                   const float* out, const float* lse, int b, int t, int c, int h,
                                   AttnMaskKind mask, int block, cudaStream_t stream) {
  backward(true, dqkv, delta, dout, qkv, out, lse, b, t, c, h, mask, block, stream);
}

}  // namespace starling::cuda
