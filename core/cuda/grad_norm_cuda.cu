// Global gradient norm without a host round trip: a deterministic sum of squares in double
// (fixed grid, fixed reduction tree, partials added in order) and clipping that reads the sum
// on the device (core/optim's clip_grad_norm arithmetic).
#include "core/cuda/check.h"
#include "core/cuda/kernels.h"

namespace starling::cuda {
namespace {

constexpr int kThreads = 256;

// Every thread of the block gets the total; fixed tree order.
__device__ double block_sum_double(double v) {
  __shared__ double partial[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  double s = 0.0;
  for (int i = 0; i < kThreads / 32; ++i) s += partial[i];
  return s;
}

__global__ void sum_squares_partial_kernel(double* partial, const float* x, size_t n) {
  double s = 0.0;
  for (size_t i = blockIdx.x * static_cast<size_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<size_t>(kSumSquaresBlocks) * kThreads) {
    const double v = x[i];
    s += v * v;
  }
  s = block_sum_double(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_squares_final_kernel(double* out, const double* partial) {
  double s = 0.0;
  for (int i = threadIdx.x; i < kSumSquaresBlocks; i += kThreads) s += partial[i];
  s = block_sum_double(s);
  if (threadIdx.x == 0) *out = s;
}

__global__ void clip_scale_kernel(float* x, size_t n, const double* norm_sq, double max_norm) {
  const double norm = sqrt(*norm_sq);
  if (!(max_norm > 0.0 && norm > max_norm)) return;
  const float s = static_cast<float>(max_norm / (norm + 1e-6));
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    x[i] *= s;
  }
}

}  // namespace

void sum_squares(double* out, double* scratch, const float* x, size_t n, cudaStream_t stream) {
  sum_squares_partial_kernel<<<kSumSquaresBlocks, kThreads, 0, stream>>>(scratch, x, n);
  STARLING_CUDA_CHECK_LAUNCH();
  sum_squares_final_kernel<<<1, kThreads, 0, stream>>>(out, scratch);
  STARLING_CUDA_CHECK_LAUNCH();
}

void clip_scale(float* x, size_t n, const double* norm_sq, double max_norm, cudaStream_t stream) {
  if (n == 0) return;
  const long long blocks = (static_cast<long long>(n) + kThreads - 1) / kThreads;
  const int grid = static_cast<int>(blocks < 65535 * 16 ? blocks : 65535 * 16);
  clip_scale_kernel<<<grid, kThreads, 0, stream>>>(x, n, norm_sq, max_norm);
  STARLING_CUDA_CHECK_LAUNCH();
}

}  // namespace starling::cuda
