// Softmax + cross-entropy fused: the forward pass computes each row's log-sum-exp and loss
// without storing probabilities; the backward pass recomputes them (one read of the logits).
// The weighted variant adds per-row weights and a padded row stride (the MDLM's loss).
#include "core/cuda/check.h"
#include "core/cuda/internal/reduce.cuh"
#include "core/cuda/kernels.h"

namespace starling::cuda {
namespace {

constexpr int kThreads = 256;

// Row max and sum of exp(x - max) over the row, every thread gets both.
__device__ void row_stats(const float* row, int v, float* mx, float* sum) {
  float m = -FLT_MAX;
  for (int j = threadIdx.x; j < v; j += blockDim.x) m = fmaxf(m, row[j]);
  m = internal::block_max(m);
  float s = 0.0f;
  for (int j = threadIdx.x; j < v; j += blockDim.x) s += expf(row[j] - m);
  *mx = m;
  *sum = internal::block_sum(s);
}

__global__ void cross_entropy_rows_kernel(float* losses, const float* logits, const int* targets,
                                          int v, int ignore_index) {
  const size_t i = blockIdx.x;
  const int t = targets[i];
  if (t == ignore_index) {
    if (threadIdx.x == 0) losses[i] = 0.0f;
    return;
  }
  const float* row = logits + i * v;
  float m, s;
  row_stats(row, v, &m, &s);
  if (threadIdx.x == 0) losses[i] = (t >= 0 && t < v) ? m + logf(s) - row[t] : NAN;
}

// One block: the mean over valid rows, added in a fixed order.
__global__ void cross_entropy_mean_kernel(float* loss, int* valid_count, const float* losses,
                                          const int* targets, int n, int ignore_index) {
  float s = 0.0f, cnt = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    if (targets[i] != ignore_index) {
      s += losses[i];
      cnt += 1.0f;
    }
  }
  s = internal::block_sum(s);
  cnt = internal::block_sum(cnt);
  if (threadIdx.x == 0) {
    const int count = static_cast<int>(cnt);
    *loss = count > 0 ? s / static_cast<float>(count) : 0.0f;
    if (valid_count != nullptr) *valid_count = count;
  }
}

__global__ void cross_entropy_backward_kernel(float* dlogits, const float* logits,
                                              const int* targets, const float* dloss,
                                              const int* valid_count, int v, int ignore_index) {
  const size_t i = blockIdx.x;
  const int t = targets[i];
  float* drow = dlogits + i * v;
  if (t == ignore_index || *valid_count == 0) {
    for (int j = threadIdx.x; j < v; j += blockDim.x) drow[j] = 0.0f;
    return;
  }
  const float* row = logits + i * v;
  float m, s;
  row_stats(row, v, &m, &s);
  const float scale = *dloss / static_cast<float>(*valid_count);
  const float inv = 1.0f / s;
  for (int j = threadIdx.x; j < v; j += blockDim.x) {
    const float p = expf(row[j] - m) * inv;
    drow[j] = (p - (j == t ? 1.0f : 0.0f)) * scale;
  }
}

// Weighted / padded: rows of VP logits, the softmax over the first V; negative targets ignored.
__global__ void weighted_ce_rows_kernel(float* losses, const float* logits, const int* targets,
                                        int v, int vp) {
  const size_t i = blockIdx.x;
  const int t = targets[i];
  if (t < 0) {
    if (threadIdx.x == 0) losses[i] = 0.0f;
    return;
  }
  const float* row = logits + i * vp;
  float m, s;
  row_stats(row, v, &m, &s);
  if (threadIdx.x == 0) losses[i] = t < v ? m + logf(s) - row[t] : NAN;
}

constexpr int kSumThreads = 512;

// One block: sum_i w_i losses_i over the kept rows in double, a fixed tree order (deterministic);
// without weights the plain sum divided by N.
__global__ void weighted_ce_sum_kernel(float* loss, const float* losses, const int* targets,
                                       const float* weights, int n) {
  __shared__ double part[kSumThreads];
  double s = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    if (targets[i] >= 0) {
      s += (weights != nullptr ? static_cast<double>(weights[i]) : 1.0) * losses[i];
    }
  }
  part[threadIdx.x] = s;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) part[threadIdx.x] += part[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    *loss = static_cast<float>(weights != nullptr ? part[0] : (n > 0 ? part[0] / n : 0.0));
  }
}

__global__ void weighted_ce_backward_kernel(float* dlogits, const float* logits, const int* targets,
                                            const float* weights, int n, int v, int vp) {
  const size_t i = blockIdx.x;
  const int t = targets[i];
  float* drow = dlogits + i * vp;
  if (t < 0) {
    for (int j = threadIdx.x; j < vp; j += blockDim.x) drow[j] = 0.0f;
    return;
  }
  const float* row = logits + i * vp;
  float m, s;
  row_stats(row, v, &m, &s);
  const float w = weights != nullptr ? weights[i] : 1.0f / static_cast<float>(n);
  const float inv = 1.0f / s;
  for (int j = threadIdx.x; j < vp; j += blockDim.x) {
    drow[j] = j < v ? expf(row[j] - m) * inv * w - (j == t ? w : 0.0f) : 0.0f;
  }
}

}  // namespace

void cross_entropy_weighted_forward(float* losses, float* loss, const float* logits,
                                    const int* targets, const float* weights, int n, int v, int vp,
                                    cudaStream_t stream) {
  if (n > 0) {
    weighted_ce_rows_kernel<<<n, kThreads, 0, stream>>>(losses, logits, targets, v, vp);
    STARLING_CUDA_CHECK_LAUNCH();
  }
  weighted_ce_sum_kernel<<<1, kSumThreads, 0, stream>>>(loss, losses, targets, weights, n);
  STARLING_CUDA_CHECK_LAUNCH();
}

void cross_entropy_weighted_backward(float* dlogits, const float* logits, const int* targets,
                                     const float* weights, int n, int v, int vp,
                                     cudaStream_t stream) {
  if (n == 0) return;
  weighted_ce_backward_kernel<<<n, kThreads, 0, stream>>>(dlogits, logits, targets, weights, n, v,
                                                          vp);
  STARLING_CUDA_CHECK_LAUNCH();
}

void cross_entropy_forward(float* losses, float* loss, int* valid_count, const float* logits,
                           const int* targets, int n, int v, int ignore_index,
                           cudaStream_t stream) {
  if (n > 0) {
    cross_entropy_rows_kernel<<<n, kThreads, 0, stream>>>(losses, logits, targets, v, ignore_index);
    STARLING_CUDA_CHECK_LAUNCH();
  }
  cross_entropy_mean_kernel<<<1, 1024, 0, stream>>>(loss, valid_count, losses, targets, n,
                                                    ignore_index);
  STARLING_CUDA_CHECK_LAUNCH();
}

void cross_entropy_backward(float* dlogits, const float* logits, const int* targets,
                            const float* dloss, const int* valid_count, int n, int v,
                            int ignore_index, cudaStream_t stream) {
  if (n == 0) return;
  cross_entropy_backward_kernel<<<n, kThreads, 0, stream>>>(dlogits, logits, targets, dloss,
                                                            valid_count, v, ignore_index);
  STARLING_CUDA_CHECK_LAUNCH();
}

}  // namespace starling::cuda
