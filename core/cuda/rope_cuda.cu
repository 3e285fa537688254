// Rotary positions on packed q and k ("rotate half", ops::rope_packed): one thread per rotated
// pair, in place; the inverse rotation (the backward on dq, dk) negates the sine.
#include "core/cuda/check.h"
#include "core/cuda/kernels.h"

namespace starling::cuda {
namespace {

constexpr int kThreads = 256;

// Pair i of head hh (of the 2H q and k heads) in row r: index ((r * 2H) + hh) * half + i.
__global__ void rope_kernel(float* qkv, const float* cos, const float* sin, size_t pairs, int c,
                            int half, int two_h, int period, float sign) {
  for (size_t k = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; k < pairs;
       k += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(k % half);
    const size_t rh = k / half;
    const int hh = static_cast<int>(rh % two_h);
    const size_t r = rh / two_h;
    const size_t tab = static_cast<size_t>(r % period) * half + i;
    const float ci = cos[tab], si = sign * sin[tab];
    float* x = qkv + r * 3 * static_cast<size_t>(c) + static_cast<size_t>(hh) * 2 * half;
    const float a = x[i], b = x[i + half];
    // Rounded products and sums (no FMA contraction), as the CPU backend computes them.
    x[i] = __fsub_rn(__fmul_rn(a, ci), __fmul_rn(b, si));
    x[i + half] = __fadd_rn(__fmul_rn(b, ci), __fmul_rn(a, si));
  }
}

}  // namespace

void rope_packed(float* qkv, const float* cos, const float* sin, int n, int c, int h, int period,
                 bool inverse, cudaStream_t stream) {
  const int half = c / h / 2;
  const size_t pairs = static_cast<size_t>(n) * 2 * h * half;
  if (pairs == 0) return;
  const long long blocks = (static_cast<long long>(pairs) + kThreads - 1) / kThreads;
  const int grid = static_cast<int>(blocks < 65535 * 16 ? blocks : 65535 * 16);
  rope_kernel<<<grid, kThreads, 0, stream>>>(qkv, cos, sin, pairs, c, half, 2 * h, period,
                                             inverse ? -1.0f : 1.0f);
  STARLING_CUDA_CHECK_LAUNCH();
}

}  // namespace starling::cuda
