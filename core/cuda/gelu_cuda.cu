// Exact (erf) GELU forward and backward, elementwise. The normal CDF is taken as
// 0.5 * erfc(-x / sqrt(2)): 1 + erf(x / sqrt(2)) cancels for negative x and loses digits there
// (x = -3.8: 1.7e-4 relative error in fp32, against 1e-7 with erfc).
#include "core/cuda/check.h"
#include "core/cuda/kernels.h"

namespace starling::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

__global__ void gelu_forward_kernel(float* y, const float* x, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float v = x[i];
    y[i] = 0.5f * v * erfcf(-v * kInvSqrt2);
  }
}

__global__ void gelu_backward_kernel(float* dx, const float* dy, const float* x, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float v = x[i];
    const float cdf = 0.5f * erfcf(-v * kInvSqrt2);
    const float pdf = expf(-0.5f * v * v) * kInvSqrt2Pi;
    dx[i] = dy[i] * (cdf + v * pdf);
  }
}

int grid_for(size_t n) {
  const long long blocks = (static_cast<long long>(n) + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

}  // namespace

void gelu_forward(float* y, const float* x, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, x, n);
  STARLING_CUDA_CHECK_LAUNCH();
}

void gelu_backward(float* dx, const float* dy, const float* x, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(dx, dy, x, n);
  STARLING_CUDA_CHECK_LAUNCH();
}

}  // namespace starling::cuda
