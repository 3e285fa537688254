// AdamW step on fp32 master weights, the arithmetic of core/optim's AdamW, with an optional
// bf16 copy of the updated weights written in the same pass.
#include <cmath>

#include "core/cuda/check.h"
#include "core/cuda/kernels.h"

namespace starling::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void adamw_kernel(float* p, __nv_bfloat16* p16, const float* g, float* m, float* v,
                             size_t n, float b1, float b2, float step_size, float inv_sqrt_bc2,
                             float eps, float decay) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float gi = g[i];
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float pi = p[i] * decay - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
    p[i] = pi;
    if (p16 != nullptr) p16[i] = __float2bfloat16_rn(pi);
  }
}

}  // namespace

void adamw_step(float* params, __nv_bfloat16* params_bf16, const float* grads, float* m, float* v,
                size_t n, const AdamWStep& s, cudaStream_t stream) {
  if (n == 0) return;
  // Scalars in double, then rounded, exactly as the CPU optimizer does.
  const double bc1 = 1.0 - std::pow(s.beta1, static_cast<double>(s.step));
  const double bc2 = 1.0 - std::pow(s.beta2, static_cast<double>(s.step));
  const float step_size = static_cast<float>(s.lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float decay = static_cast<float>(1.0 - s.lr * s.weight_decay);
  const long long blocks = (static_cast<long long>(n) + kThreads - 1) / kThreads;
  const int grid = static_cast<int>(blocks < 65535 * 16 ? blocks : 65535 * 16);
  adamw_kernel<<<grid, kThreads, 0, stream>>>(
      params, params_bf16, grads, m, v, n, static_cast<float>(s.beta1), static_cast<float>(s.beta2),
      step_size, inv_sqrt_bc2, static_cast<float>(s.eps), decay);
  STARLING_CUDA_CHECK_LAUNCH();
}

}  // namespace starling::cuda
