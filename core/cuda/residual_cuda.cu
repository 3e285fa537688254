// Elementwise a + b and a - b (out may alias either input): the fused GPT's residual stream, and a
// federated client's delta (trained weights minus the global model).
#include "core/cuda/check.h"
#include "core/cuda/kernels.h"

namespace starling::cuda {
namespace {

constexpr int kThreads = 256;

template <bool kSubtract>
__global__ void binary_kernel(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = kSubtract ? a[i] - b[i] : a[i] + b[i];
  }
}

template <bool kSubtract>
void launch(float* out, const float* a, const float* b, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  const long long blocks = (static_cast<long long>(n) + kThreads - 1) / kThreads;
  const int grid = static_cast<int>(blocks < 65535 * 16 ? blocks : 65535 * 16);
  binary_kernel<kSubtract><<<grid, kThreads, 0, stream>>>(out, a, b, n);
  STARLING_CUDA_CHECK_LAUNCH();
}

}  // namespace

void residual_add(float* out, const float* a, const float* b, size_t n, cudaStream_t stream) {
  launch<false>(out, a, b, n, stream);
}

void subtract(float* out, const float* a, const float* b, size_t n, cudaStream_t stream) {
  launch<true>(out, a, b, n, stream);
}

}  // namespace starling::cuda
