// GPT's embedding layer: token + position gather forward, and a deterministic backward that
// sums each token's positions in a fixed order (buckets built on the host) instead of atomics.
#include "core/cuda/check.h"
#include "core/cuda/internal/reduce.cuh"
#include "core/cuda/kernels.h"

namespace starling::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void encoder_forward_kernel(float* out, const int* idx, const float* wte,
                                       const float* wpe, size_t n, int t, int c) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t row = i / c;
    const int j = static_cast<int>(i % c);
    const int pos = static_cast<int>(row % t);
    out[i] = wte[static_cast<size_t>(idx[row]) * c + j] + wpe[static_cast<size_t>(pos) * c + j];
  }
}

// Block (u, channel tile): thread j adds dout[p, j] over bucket u's positions p in order.
__global__ void encoder_backward_wte_kernel(float* dwte, const float* dout, const int* order,
                                            const int* starts, const int* tokens, int c) {
  const int u = blockIdx.x;
  const int j = blockIdx.y * blockDim.x + threadIdx.x;
  if (j >= c) return;
  float acc = 0.0f;
  for (int i = starts[u]; i < starts[u + 1]; ++i)
    acc += dout[static_cast<size_t>(order[i]) * c + j];
  dwte[static_cast<size_t>(tokens[u]) * c + j] += acc;
}

// Thread (t, j): dwpe[t, j] += sum over b (in b order) of dout[b, t, j].
__global__ void encoder_backward_wpe_kernel(float* dwpe, const float* dout, int b, int t, int c) {
  const size_t n = static_cast<size_t>(t) * c;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int bb = 0; bb < b; ++bb) s += dout[static_cast<size_t>(bb) * n + i];
    dwpe[i] += s;
  }
}

int grid_for(size_t n) {
  const long long blocks = (static_cast<long long>(n) + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

}  // namespace

void encoder_forward(float* out, const int* idx, const float* wte, const float* wpe, int b, int t,
                     int c, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(b) * t * c;
  if (n == 0) return;
  encoder_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, idx, wte, wpe, n, t, c);
  STARLING_CUDA_CHECK_LAUNCH();
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* order,
                      const int* starts, const int* tokens, int num_unique, int b, int t, int c,
                      cudaStream_t stream) {
  if (num_unique > 0 && c > 0) {
    const dim3 grid(static_cast<unsigned>(num_unique),
                    static_cast<unsigned>(internal::ceil_div(c, kThreads)));
    encoder_backward_wte_kernel<<<grid, kThreads, 0, stream>>>(dwte, dout, order, starts, tokens,
                                                               c);
    STARLING_CUDA_CHECK_LAUNCH();
  }
  const size_t n = static_cast<size_t>(t) * c;
  if (n == 0) return;
  encoder_backward_wpe_kernel<<<grid_for(n), kThreads, 0, stream>>>(dwpe, dout, b, t, c);
  STARLING_CUDA_CHECK_LAUNCH();
}

}  // namespace starling::cuda
