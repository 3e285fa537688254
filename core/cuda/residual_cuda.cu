// Elementwise residual add (out may alias either input), for the fused GPT's residual stream.
#include "core/cuda/check.h"
#include "core/cuda/kernels.h"

namespace starling::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void residual_add_kernel(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = a[i] + b[i];
  }
}

}  // namespace

void residual_add(float* out, const float* a, const float* b, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  const long long blocks = (static_cast<long long>(n) + kThreads - 1) / kThreads;
  const int grid = static_cast<int>(blocks < 65535 * 16 ? blocks : 65535 * 16);
  residual_add_kernel<<<grid, kThreads, 0, stream>>>(out, a, b, n);
  STARLING_CUDA_CHECK_LAUNCH();
}

}  // namespace starling::cuda
