// Attention over packed heads with cuBLAS under any ops::AttnMask kind (full, causal,
// block-causal, block diffusion: at most two key ranges per query): per batch element,
// strided-batched GEMMs over the H heads read q, k, v in place from (T, 3C) (head h at column
// h*D, leading dimension 3C), so no head is transposed or copied. The (B, H, T, T) probabilities
// are materialized; a flash-style kernel that never stores them is the next step for long T.
#include <cmath>

#include "core/cuda/check.h"
#include "core/cuda/internal/reduce.cuh"
#include "core/cuda/kernels.h"

namespace starling::cuda {
namespace {

constexpr int kThreads = 128;

// The keys of query i in a sequence of n: [r0, r1) and [r2, r3), as ops::AttnMask::key_ranges.
struct KeyRanges {
  int r0, r1, r2, r3;
  __device__ bool contains(int j) const { return (j >= r0 && j < r1) || (j >= r2 && j < r3); }
};

__device__ KeyRanges key_ranges(AttnMaskKind kind, int block, int i, int n) {
  switch (kind) {
    case AttnMaskKind::kCausal:
      return {0, i + 1, 0, 0};
    case AttnMaskKind::kBlockCausal:
      return {0, min(n, (i / block + 1) * block), 0, 0};
    case AttnMaskKind::kBlockDiffusion: {
      const int half = n / 2;
      if (i < half) {  // noisy query: the clean blocks before its own, then its own noisy block
        const int b0 = (i / block) * block;
        return {half, half + b0, b0, b0 + block};
      }
      return {half, half + ((i - half) / block + 1) * block, 0, 0};
    }
    case AttnMaskKind::kFull:
      break;
  }
  return {0, n, 0, 0};
}

// Softmax of each row of (rows, T) in place over the keys the mask gives query t = r % T (the
// rest become 0).
__global__ void masked_softmax_kernel(float* att, int t_len, AttnMaskKind kind, int block) {
  const size_t r = blockIdx.x;
  float* row = att + r * t_len;
  const KeyRanges keys = key_ranges(kind, block, static_cast<int>(r % t_len), t_len);
  float m = -FLT_MAX;
  for (int j = threadIdx.x; j < t_len; j += blockDim.x) {
    if (keys.contains(j)) m = fmaxf(m, row[j]);
  }
  m = internal::block_max(m);
  float s = 0.0f;
  for (int j = threadIdx.x; j < t_len; j += blockDim.x) {
    if (keys.contains(j)) s += expf(row[j] - m);
  }
  const float inv = 1.0f / internal::block_sum(s);
  for (int j = threadIdx.x; j < t_len; j += blockDim.x) {
    row[j] = keys.contains(j) ? expf(row[j] - m) * inv : 0.0f;
  }
}

// dS = P * (dP - rowsum(dP * P)) * scale, in place over dP.
__global__ void softmax_backward_kernel(float* dp, const float* p, int t_len, float scale) {
  const size_t r = blockIdx.x;
  float* drow = dp + r * t_len;
  const float* prow = p + r * t_len;
  float dot = 0.0f;
  for (int j = threadIdx.x; j < t_len; j += blockDim.x) dot += drow[j] * prow[j];
  dot = internal::block_sum(dot);
  for (int j = threadIdx.x; j < t_len; j += blockDim.x) {
    drow[j] = prow[j] * (drow[j] - dot) * scale;
  }
}

float attention_scale(int d) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(d))); }

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int b, int t, int c, int h,
                       bool causal, cublasHandle_t handle, cudaStream_t stream) {
  attention_forward(out, att, qkv, b, t, c, h, causal ? AttnMaskKind::kCausal : AttnMaskKind::kFull,
                    1, handle, stream);
}

void attention_forward(float* out, float* att, const float* qkv, int b, int t, int c, int h,
                       AttnMaskKind mask, int block, cublasHandle_t handle, cudaStream_t stream) {
  if (b == 0 || t == 0) return;
  const int d = c / h;
  const long long tt = static_cast<long long>(t) * t;
  for (int i = 0; i < b; ++i) {
    const float* q = qkv + static_cast<size_t>(i) * t * 3 * c;
    float* a = att + static_cast<size_t>(i) * h * tt;
    // S_h = scale * Q_h K_h^T: (T, D) x (D, T), heads D columns apart.
    gemm_strided_batched(false, true, t, t, d, attention_scale(d), q, 3 * c, d, q + c, 3 * c, d,
                         0.0f, a, t, tt, h, handle, stream);
  }
  masked_softmax_kernel<<<static_cast<unsigned>(static_cast<long long>(b) * h * t), kThreads, 0,
                          stream>>>(att, t, mask, block);
  STARLING_CUDA_CHECK_LAUNCH();
  for (int i = 0; i < b; ++i) {
    const float* v = qkv + static_cast<size_t>(i) * t * 3 * c + 2 * c;
    // O_h = P_h V_h: (T, T) x (T, D) into columns h*D of (T, C).
    gemm_strided_batched(false, false, t, d, t, 1.0f, att + static_cast<size_t>(i) * h * tt, t, tt,
                         v, 3 * c, d, 0.0f, out + static_cast<size_t>(i) * t * c, c, d, h, handle,
                         stream);
  }
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int b, int t, int c, int h, cublasHandle_t handle,
                        cudaStream_t stream) {
  if (b == 0 || t == 0) return;
  const int d = c / h;
  const long long tt = static_cast<long long>(t) * t;
  for (int i = 0; i < b; ++i) {
    const float* dq_out = dout + static_cast<size_t>(i) * t * c;
    const float* v = qkv + static_cast<size_t>(i) * t * 3 * c + 2 * c;
    // dP_h = dO_h V_h^T.
    gemm_strided_batched(false, true, t, t, d, 1.0f, dq_out, c, d, v, 3 * c, d, 0.0f,
                         scratch + static_cast<size_t>(i) * h * tt, t, tt, h, handle, stream);
  }
  softmax_backward_kernel<<<static_cast<unsigned>(static_cast<long long>(b) * h * t), kThreads, 0,
                            stream>>>(scratch, att, t, attention_scale(d));
  STARLING_CUDA_CHECK_LAUNCH();
  for (int i = 0; i < b; ++i) {
    const size_t base = static_cast<size_t>(i) * t * 3 * c;
    const float* q = qkv + base;
    const float* k = qkv + base + c;
    const float* ds = scratch + static_cast<size_t>(i) * h * tt;
    const float* p = att + static_cast<size_t>(i) * h * tt;
    const float* dob = dout + static_cast<size_t>(i) * t * c;
    // dQ_h = dS_h K_h, dK_h = dS_h^T Q_h, dV_h = P_h^T dO_h.
    gemm_strided_batched(false, false, t, d, t, 1.0f, ds, t, tt, k, 3 * c, d, 0.0f, dqkv + base,
                         3 * c, d, h, handle, stream);
    gemm_strided_batched(true, false, t, d, t, 1.0f, ds, t, tt, q, 3 * c, d, 0.0f, dqkv + base + c,
                         3 * c, d, h, handle, stream);
    gemm_strided_batched(true, false, t, d, t, 1.0f, p, t, tt, dob, c, d, 0.0f, dqkv + base + 2 * c,
                         3 * c, d, h, handle, stream);
  }
}

}  // namespace starling::cuda
