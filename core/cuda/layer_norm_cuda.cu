// Layer norm forward and backward: one block per row with block reductions; the weight and bias
// gradients are column sums in row order (deterministic).
#include "core/cuda/check.h"
#include "core/cuda/internal/column_sums.cuh"
#include "core/cuda/internal/reduce.cuh"
#include "core/cuda/kernels.h"

namespace starling::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void layer_norm_forward_kernel(float* y, float* mean, float* rstd, const float* x,
                                          const float* w, const float* b, int c, float eps) {
  const size_t row = blockIdx.x;
  const float* xr = x + row * c;
  float s = 0.0f;
  for (int j = threadIdx.x; j < c; j += blockDim.x) s += xr[j];
  const float m = internal::block_sum(s) / static_cast<float>(c);
  float var = 0.0f;
  for (int j = threadIdx.x; j < c; j += blockDim.x) var += (xr[j] - m) * (xr[j] - m);
  const float rs = 1.0f / sqrtf(internal::block_sum(var) / static_cast<float>(c) + eps);
  float* yr = y + row * c;
  for (int j = threadIdx.x; j < c; j += blockDim.x) {
    yr[j] = (xr[j] - m) * rs * w[j] + (b != nullptr ? b[j] : 0.0f);
  }
  if (threadIdx.x == 0) {
    if (mean != nullptr) mean[row] = m;
    if (rstd != nullptr) rstd[row] = rs;
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w.
__global__ void layer_norm_dx_kernel(float* dx, const float* dy, const float* x, const float* w,
                                     const float* mean, const float* rstd, int c) {
  const size_t row = blockIdx.x;
  const float* xr = x + row * c;
  const float* dyr = dy + row * c;
  const float m = mean[row], rs = rstd[row];
  float s1 = 0.0f, s2 = 0.0f;
  for (int j = threadIdx.x; j < c; j += blockDim.x) {
    const float g = dyr[j] * w[j];
    s1 += g;
    s2 += g * (xr[j] - m) * rs;
  }
  const float mg = internal::block_sum(s1) / static_cast<float>(c);
  const float mgx = internal::block_sum(s2) / static_cast<float>(c);
  float* dxr = dx + row * c;
  for (int j = threadIdx.x; j < c; j += blockDim.x) {
    const float xhat = (xr[j] - m) * rs;
    dxr[j] = rs * (dyr[j] * w[j] - mg - xhat * mgx);
  }
}

// Block (32, kRowLanes): 32 columns; grid.y splits the rows into gridDim.y slices so that a
// narrow C still fills the chip (C = 384 is 12 column blocks). Rows of a slice are strided over
// threadIdx.y, the kRowLanes partial sums of each column added in y order, and each slice writes
// its own partial row: part_w[slice][j]. column_partials_sum then adds the slices in order, so
// the result is deterministic.
constexpr int kRowLanes = 16;
__global__ void layer_norm_dparams_kernel(float* part_w, float* part_b, const float* dy,
                                          const float* x, const float* mean, const float* rstd,
                                          int n, int c, int rows_per_slice) {
  __shared__ float sw_part[kRowLanes][33], sb_part[kRowLanes][33];
  const int j = blockIdx.x * 32 + threadIdx.x;
  const int begin = blockIdx.y * rows_per_slice;
  const int end = min(n, begin + rows_per_slice);
  float sw = 0.0f, sb = 0.0f;
  if (j < c) {
    for (int i = begin + threadIdx.y; i < end; i += kRowLanes) {
      const size_t at = static_cast<size_t>(i) * c + j;
      const float g = dy[at];
      sw += g * (x[at] - mean[i]) * rstd[i];
      sb += g;
    }
  }
  sw_part[threadIdx.y][threadIdx.x] = sw;
  sb_part[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y == 0 && j < c) {
    float tw = 0.0f, tb = 0.0f;
    for (int y = 0; y < kRowLanes; ++y) {
      tw += sw_part[y][threadIdx.x];
      tb += sb_part[y][threadIdx.x];
    }
    part_w[static_cast<size_t>(blockIdx.y) * c + j] = tw;
    part_b[static_cast<size_t>(blockIdx.y) * c + j] = tb;
  }
}

}  // namespace

void layer_norm_forward(float* y, float* mean, float* rstd, const float* x, const float* weight,
                        const float* bias, int n, int c, float eps, cudaStream_t stream) {
  if (n == 0) return;
  layer_norm_forward_kernel<<<n, kThreads, 0, stream>>>(y, mean, rstd, x, weight, bias, c, eps);
  STARLING_CUDA_CHECK_LAUNCH();
}

void layer_norm_backward(float* dx, float* dweight, float* dbias, const float* dy, const float* x,
                         const float* weight, const float* mean, const float* rstd, int n, int c,
                         cudaStream_t stream) {
  if (n > 0) {
    layer_norm_dx_kernel<<<n, kThreads, 0, stream>>>(dx, dy, x, weight, mean, rstd, c);
    STARLING_CUDA_CHECK_LAUNCH();
  }
  if (c == 0 || n == 0) return;
  const internal::RowSlices sl = internal::row_slices(n, c);
  // [slices][c] weight partials, then [slices][c] bias partials.
  const size_t part_elems = static_cast<size_t>(sl.slices) * c;
  float* part = internal::partials_alloc(2 * part_elems, stream);
  layer_norm_dparams_kernel<<<dim3(internal::ceil_div(c, 32), sl.slices), dim3(32, kRowLanes), 0,
                              stream>>>(part, part + part_elems, dy, x, mean, rstd, n, c,
                                        sl.rows_per_slice);
  STARLING_CUDA_CHECK_LAUNCH();
  internal::column_partials_sum(dweight, part, sl.slices, c, stream);
  if (dbias != nullptr)
    internal::column_partials_sum(dbias, part + part_elems, sl.slices, c, stream);
  STARLING_CUDA_CHECK(cudaFreeAsync(part, stream));
}

}  // namespace starling::cuda
