// Flash-style attention kernels (core/cuda/internal/flash_attention.h holds the arithmetic, shared
// with the CPU emulation test): the forward, Delta, dQ, dV and dK passes, each a grid of
// (B * H, ceil(T / kRows)) blocks of kRows threads, one row per thread, K/V (or Q/dO) tiles in
// shared memory. Head sizes up to 128, dispatched on DM in {16, 32, 64, 128}.
#include <cmath>

#include "core/cuda/check.h"
#include "core/cuda/internal/flash_attention.h"
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

flash::Shape make_shape(int b, int t, int c, int h, AttnMaskKind mask, int block) {
  flash::Shape s;
  s.b = b;
  s.t = t;
  s.c = c;
  s.h = h;
  s.d = c / h;
  s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.d)));
  s.mask = static_cast<int>(mask);
  s.block = block > 0 ? block : 1;
  return s;
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

}  // namespace

bool flash_attention_supported(int head_dim) { return head_dim >= 1 && head_dim <= 128; }

void flash_attention_forward(float* out, float* lse, const float* qkv, int b, int t, int c, int h,
                             AttnMaskKind mask, int block, cudaStream_t stream) {
  if (b == 0 || t == 0) return;
  const flash::Shape s = make_shape(b, t, c, h, mask, block);
  if (s.d <= 16) {
    forward_dm<16>(out, lse, qkv, s, stream);
  } else if (s.d <= 32) {
    forward_dm<32>(out, lse, qkv, s, stream);
  } else if (s.d <= 64) {
    forward_dm<64>(out, lse, qkv, s, stream);
  } else {
    forward_dm<128>(out, lse, qkv, s, stream);
  }
}

void flash_attention_backward(float* dqkv, float* delta, const float* dout, const float* qkv,
                              const float* out, const float* lse, int b, int t, int c, int h,
                              AttnMaskKind mask, int block, cudaStream_t stream) {
  if (b == 0 || t == 0) return;
  const flash::Shape s = make_shape(b, t, c, h, mask, block);
  flash_delta_kernel<<<dim3(static_cast<unsigned>(b * h), static_cast<unsigned>((t + 127) / 128)),
                       128, 0, stream>>>(delta, dout, out, s);
  STARLING_CUDA_CHECK_LAUNCH();
  if (s.d <= 16) {
    backward_dm<16>(dqkv, qkv, dout, lse, delta, s, stream);
  } else if (s.d <= 32) {
    backward_dm<32>(dqkv, qkv, dout, lse, delta, s, stream);
  } else if (s.d <= 64) {
    backward_dm<64>(dqkv, qkv, dout, lse, delta, s, stream);
  } else {
    backward_dm<128>(dqkv, qkv, dout, lse, delta, s, stream);
  }
}

}  // namespace starling::cuda
