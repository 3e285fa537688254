// Kernels of image_kernels.h. fp32 arithmetic that the CPU reference rounds after every operation
// goes through __f*_rn intrinsics, so nvcc's FMA contraction does not move the results off the
// CPU's; sums are in double over fixed trees (no atomics), so every result is deterministic.
#include <climits>
#include <cmath>
#include <cstdint>

#include "core/cuda/check.h"
#include "core/cuda/image_kernels.h"

// A violated precondition of a launcher is a caller bug: abort with the condition, file, line.
#define STARLING_IMAGE_REQUIRE(cond)                                                     \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      ::starling::cuda::internal::check_failed(#cond, "precondition violated", __FILE__, \
                                               __LINE__);                                \
    }                                                                                    \
  } while (0)

namespace starling::cuda {
namespace {

constexpr int kThreads = 256;

int grid_for(size_t n) {
  const long long blocks = (static_cast<long long>(n) + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

// Whether grid-stride loops over n elements may count in uint32_t: n < 2^31, so i plus the
// largest grid stride (grid_for's 65535 * 16 blocks of kThreads < 2^28) cannot wrap.
bool small_index(size_t n) { return n <= static_cast<size_t>(INT_MAX); }

// ops::internal::fast_expf (core/ops/internal/fast_math.h) with the same roundings.
__device__ __forceinline__ float fast_expf(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  const float n = __fsub_rn(__fadd_rn(__fmul_rn(x, 1.44269504088896341f), kRound), kRound);
  const float r = __fsub_rn(__fsub_rn(x, __fmul_rn(n, 0.693145751953125f)),
                            __fmul_rn(n, 1.428606765330187e-06f));
  float p = 1.3888889e-3f;
  p = __fadd_rn(__fmul_rn(p, r), 8.3333338e-3f);
  p = __fadd_rn(__fmul_rn(p, r), 4.1666668e-2f);
  p = __fadd_rn(__fmul_rn(p, r), 1.6666667e-1f);
  p = __fadd_rn(__fmul_rn(p, r), 0.5f);
  p = __fadd_rn(__fmul_rn(p, __fmul_rn(r, r)), __fadd_rn(r, 1.0f));
  const int e = static_cast<int>(n) + 127;
  return __fmul_rn(p, __int_as_float(e << 23));
}

// activation_cpu.cc's silu_fwd: x / (1 + exp(-x)).
__device__ __forceinline__ float silu_value(float x) {
  return __fdiv_rn(x, __fadd_rn(1.0f, fast_expf(-x)));
}

// activation_cpu.cc's silu_bwd: s (1 + x (1 - s)), s = 1 / (1 + exp(-x)).
__device__ __forceinline__ float silu_derivative(float x) {
  const float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, fast_expf(-x)));
  return __fmul_rn(s, __fadd_rn(1.0f, __fmul_rn(x, __fsub_rn(1.0f, s))));
}

// norm2d_cpu.cc's silu_grad_row for one element: the gradient g reaching z = x a + sh through
// SiLU, (g sig) (1 + z (1 - sig)).
__device__ __forceinline__ float silu_grad_through(float g, float x, float a, float sh) {
  const float z = __fadd_rn(__fmul_rn(x, a), sh);
  const float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, fast_expf(-z)));
  return __fmul_rn(__fmul_rn(g, sig), __fadd_rn(1.0f, __fmul_rn(z, __fsub_rn(1.0f, sig))));
}

// Sums v[0..N) over the block; every thread gets the totals. Fixed tree: warp butterflies, then
// the warps' partials in warp order. Safe to call repeatedly in one kernel.
// REQUIRES: blockDim.x a multiple of 32, at most 1024.
template <int N>
__device__ void block_sum_doubles(double (&v)[N]) {
  __shared__ double partial[N][32];
#pragma unroll
  for (int k = 0; k < N; ++k) {
    for (int o = 16; o > 0; o >>= 1) v[k] += __shfl_xor_sync(0xffffffffu, v[k], o);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < N; ++k) partial[k][warp] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < N; ++k) {
    double s = 0.0;
    for (int i = 0; i < warps; ++i) s += partial[k][i];
    v[k] = s;
  }
}

// ---- group norm ----------------------------------------------------------------------------

// A channel's y = a x + sh in float (norm2d_cpu.cc's channel_affine): a = float(rs) w,
// sh = b - float(mc) a, mc the channel's mean as seen from x (the group mean minus its shift).
struct Affine {
  float a, sh;
};
__device__ __forceinline__ Affine channel_affine(double mc, float rs, float w, float b) {
  const float a = __fmul_rn(rs, w);
  return {a, __fsub_rn(b, __fmul_rn(static_cast<float>(mc), a))};
}

// Grid: B * groups blocks, block r the (image r / groups, group r % groups) row of
// len = (C / groups) * S contiguous values; kThreads threads stride over the row twice: the
// double sums of x + shift and its square, then y. Element j of the row is channel j / S of the
// group.
__global__ void group_norm_forward_kernel(float* y, double* mean, double* rstd, const float* x,
                                          const float* shift, const float* w, const float* bias,
                                          int c, int s, int groups, double eps, bool silu) {
  const int row = blockIdx.x, cg = c / groups;
  const int img = row / groups, c0 = (row % groups) * cg;
  const int len = cg * s;
  const size_t base = static_cast<size_t>(row) * len;
  const float* xr = x + base;
  const float* sr = shift != nullptr ? shift + static_cast<size_t>(img) * c + c0 : nullptr;
  double acc[2] = {0.0, 0.0};
  for (int j = threadIdx.x; j < len; j += blockDim.x) {
    double v = static_cast<double>(xr[j]);
    if (sr != nullptr) v += static_cast<double>(sr[j / s]);
    acc[0] += v;
    acc[1] += v * v;
  }
  block_sum_doubles(acc);
  const double n = static_cast<double>(len);
  const double m = acc[0] / n;
  const double var = fmax(0.0, acc[1] / n - m * m);
  const double rs = 1.0 / sqrt(var + eps);
  if (threadIdx.x == 0) {
    if (mean != nullptr) mean[row] = m;
    if (rstd != nullptr) rstd[row] = rs;
  }
  const float rs_f = static_cast<float>(rs);
  float* yr = y + base;
  for (int j = threadIdx.x; j < len; j += blockDim.x) {
    const int ch = j / s;
    const double mc = sr != nullptr ? m - static_cast<double>(sr[ch]) : m;
    const Affine af = channel_affine(mc, rs_f, w[c0 + ch], bias != nullptr ? bias[c0 + ch] : 0.0f);
    const float z = __fadd_rn(__fmul_rn(xr[j], af.a), af.sh);
    yr[j] = silu ? silu_value(z) : z;
  }
}

// Grid: B * C blocks, block q the (image q / C, channel q % C) plane of S values; blockDim.x a
// power of two in [32, kThreads] near S, threads striding over the plane. Writes the plane's
// sg = sum(g), sgx = rs sum(g (x - mc)) and (sx non-null) sx = sum(x), g the gradient reaching
// the normalized value (through SiLU when silu): norm2d_cpu.cc's per-channel sums.
__global__ void group_norm_channel_sums_kernel(double* sg, double* sgx, double* sx, const float* dy,
                                               const float* x, const float* shift, const float* w,
                                               const float* bias, const double* mean,
                                               const double* rstd, int c, int s, int groups,
                                               bool silu) {
  const int q = blockIdx.x, img = q / c, ch = q % c;
  const int row = img * groups + ch / (c / groups);
  const double rs = rstd[row];
  const double mc = shift != nullptr ? mean[row] - static_cast<double>(shift[q]) : mean[row];
  const Affine af =
      channel_affine(mc, static_cast<float>(rs), w[ch], bias != nullptr ? bias[ch] : 0.0f);
  const float* xp = x + static_cast<size_t>(q) * s;
  const float* gp = dy + static_cast<size_t>(q) * s;
  double acc[3] = {0.0, 0.0, 0.0};
  for (int p = threadIdx.x; p < s; p += blockDim.x) {
    const float xv = xp[p];
    const float g = silu ? silu_grad_through(gp[p], xv, af.a, af.sh) : gp[p];
    acc[0] += static_cast<double>(g);
    acc[1] += static_cast<double>(g) * (static_cast<double>(xv) - mc);
    acc[2] += static_cast<double>(xv);
  }
  block_sum_doubles(acc);
  if (threadIdx.x == 0) {
    sg[q] = acc[0];
    sgx[q] = rs * acc[1];
    if (sx != nullptr) sx[q] = acc[2];
  }
}

// Grid: B * groups blocks, block r the (image, group) row as in the forward; kThreads threads.
// Thread 0 folds the row's channel sums into mean_d = sum(sg w) / len and
// mean_dx = sum(sgx w) / len in channel order (the CPU's); then the threads stride over the
// group's channels (dshift) and over the row's len values (dx = a g + bx x + cc, the CPU's
// per-channel coefficients folded in double and applied in float).
__global__ void group_norm_dx_kernel(float* dx, float* dshift, const double* sg, const double* sgx,
                                     const double* sx, const float* dy, const float* x,
                                     const float* shift, const float* w, const float* bias,
                                     const double* mean, const double* rstd, int c, int s,
                                     int groups, bool silu) {
  __shared__ double means[2];
  const int row = blockIdx.x, cg = c / groups;
  const int img = row / groups, c0 = (row % groups) * cg;
  const int len = cg * s;
  const size_t base = static_cast<size_t>(row) * len;   // = (img C + c0) S
  const size_t q0 = static_cast<size_t>(img) * c + c0;  // plane index of the group's channel 0
  const double len_d = static_cast<double>(len);
  if (threadIdx.x == 0) {
    double md = 0.0, mdx = 0.0;
    for (int ch = 0; ch < cg; ++ch) {
      md += sg[q0 + ch] * static_cast<double>(w[c0 + ch]);
      mdx += sgx[q0 + ch] * static_cast<double>(w[c0 + ch]);
    }
    means[0] = md / len_d;
    means[1] = mdx / len_d;
  }
  __syncthreads();
  const double mean_d = means[0], mean_dx = means[1];
  const double m = mean[row], rs = rstd[row];
  const float rs_f = static_cast<float>(rs);
  const double bd = -rs * rs * mean_dx;
  const float bx = static_cast<float>(bd);
  if (dshift != nullptr && shift != nullptr) {
    // The shift's gradient: the sum of its channel's dx, a sum(g) + bx sum(x) + S cc in double.
    for (int ch = threadIdx.x; ch < cg; ch += blockDim.x) {
      const size_t q = q0 + ch;
      const double mc = m - static_cast<double>(shift[q]);
      const double ad = rs * static_cast<double>(w[c0 + ch]);
      const double cd = rs * (mc * rs * mean_dx - mean_d);
      dshift[q] = static_cast<float>(ad * sg[q] + bd * sx[q] + static_cast<double>(s) * cd);
    }
  }
  for (int j = threadIdx.x; j < len; j += blockDim.x) {
    const int ch = j / s;
    const double mc = shift != nullptr ? m - static_cast<double>(shift[q0 + ch]) : m;
    const float wc = w[c0 + ch];
    const float a = static_cast<float>(rs * static_cast<double>(wc));
    const float cc = static_cast<float>(rs * (mc * rs * mean_dx - mean_d));
    const float xv = x[base + j];
    float g = dy[base + j];
    if (silu) {
      const Affine af = channel_affine(mc, rs_f, wc, bias != nullptr ? bias[c0 + ch] : 0.0f);
      g = silu_grad_through(g, xv, af.a, af.sh);
    }
    dx[base + j] = __fadd_rn(__fadd_rn(__fmul_rn(a, g), __fmul_rn(bx, xv)), cc);
  }
}

// Grid: ceil(C / kThreads) blocks, one thread per channel adding its B per-image sums in image
// order (the CPU's): dweight = sum sgx, dbias = sum sg.
__global__ void group_norm_params_kernel(float* dweight, float* dbias, const double* sg,
                                         const double* sgx, int b, int c) {
  const int ch = blockIdx.x * blockDim.x + threadIdx.x;
  if (ch >= c) return;
  double w_sum = 0.0, b_sum = 0.0;
  for (int img = 0; img < b; ++img) {
    const size_t q = static_cast<size_t>(img) * c + ch;
    w_sum += sgx[q];
    b_sum += sg[q];
  }
  if (dweight != nullptr) dweight[ch] = static_cast<float>(w_sum);
  if (dbias != nullptr) dbias[ch] = static_cast<float>(b_sum);
}

// ---- pointwise -----------------------------------------------------------------------------

enum class Pointwise { kSiluFwd, kSiluBwd, kReluFwd, kReluBwd, kAdd, kSub, kMul, kAccumulate };

// Grid-stride over n values, one thread per value. For the forward kinds b is unused; for the
// backward kinds a is dy and b is x.
template <Pointwise kOp>
__global__ void pointwise_kernel(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float r;
    if constexpr (kOp == Pointwise::kSiluFwd) {
      r = silu_value(a[i]);
    } else if constexpr (kOp == Pointwise::kSiluBwd) {
      r = __fmul_rn(a[i], silu_derivative(b[i]));
    } else if constexpr (kOp == Pointwise::kReluFwd) {
      const float v = a[i];
      r = v > 0.0f ? v : 0.0f;
    } else if constexpr (kOp == Pointwise::kReluBwd) {
      r = b[i] > 0.0f ? a[i] : 0.0f;
    } else if constexpr (kOp == Pointwise::kAdd || kOp == Pointwise::kAccumulate) {
      r = __fadd_rn(a[i], b[i]);
    } else if constexpr (kOp == Pointwise::kSub) {
      r = __fsub_rn(a[i], b[i]);
    } else {
      r = __fmul_rn(a[i], b[i]);
    }
    out[i] = r;
  }
}

template <Pointwise kOp>
void launch_pointwise(float* out, const float* a, const float* b, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  pointwise_kernel<kOp><<<grid_for(n), kThreads, 0, stream>>>(out, a, b, n);
  STARLING_CUDA_CHECK_LAUNCH();
}

// Grid-stride over n values, one thread per value: ema = d ema + (1 - d) w.
__global__ void ema_lerp_kernel(float* ema, const float* w, float d, float one_minus_d, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(blockDim.x) * gridDim.x) {
    ema[i] = __fadd_rn(__fmul_rn(d, ema[i]), __fmul_rn(one_minus_d, w[i]));
  }
}

// Grid-stride over n values, one thread per value: out = v.
__global__ void fill_kernel(float* out, float v, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(blockDim.x) * gridDim.x) {
    out[i] = v;
  }
}

// Grid-stride over n values, one thread per value: out = a * s.
__global__ void scale_kernel(float* out, const float* a, float s, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = __fmul_rn(a[i], s);
  }
}

// ---- pooling and upsampling ----------------------------------------------------------------
// Index: uint32_t when small_index(n) (cheap divisions), else uint64_t.

// Grid-stride over the P * (H f) * (W f) outputs, one thread per output reading its source.
template <typename Index>
__global__ void upsample_forward_kernel(float* y, const float* x, Index n, int h, int w, int f) {
  const Index wo = static_cast<Index>(w) * f, ho = static_cast<Index>(h) * f;
  for (Index i = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    const Index ox = i % wo, t = i / wo;
    const Index oy = t % ho, p = t / ho;
    y[i] = x[(static_cast<size_t>(p) * h + oy / f) * w + ox / f];
  }
}

// Grid-stride over the P * H * W inputs, one thread per input summing its f x f block from 0,
// row by row, left to right.
template <typename Index>
__global__ void upsample_backward_kernel(float* dx, const float* dy, Index n, int h, int w, int f) {
  const size_t wo = static_cast<size_t>(w) * f, ho = static_cast<size_t>(h) * f;
  for (Index i = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    const Index xx = i % w, t = i / w;
    const Index yy = t % h, p = t / h;
    const float* src = dy + (static_cast<size_t>(p) * ho + static_cast<size_t>(yy) * f) * wo +
                       static_cast<size_t>(xx) * f;
    float s = 0.0f;
    for (int r = 0; r < f; ++r) {
      for (int k = 0; k < f; ++k) s = __fadd_rn(s, src[r * wo + k]);
    }
    dx[i] = s;
  }
}

// Grid-stride over the P * Ho * Wo outputs, one thread per output scanning its k x k window in
// row-major order, keeping the first strict maximum (the CPU's rule).
template <typename Index>
__global__ void max_pool_forward_kernel(float* y, int* argmax, const float* x, Index n, int h,
                                        int w, int ho, int wo, int k, int st) {
  for (Index i = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    const int ox = static_cast<int>(i % wo);
    const Index t = i / wo;
    const int oy = static_cast<int>(t % ho);
    const Index p = t / ho;
    const float* plane = x + static_cast<size_t>(p) * h * w;
    int best = oy * st * w + ox * st;
    float best_v = plane[best];
    for (int di = 0; di < k; ++di) {
      const int rbase = (oy * st + di) * w + ox * st;
      for (int dj = 0; dj < k; ++dj) {
        const float v = plane[rbase + dj];
        if (v > best_v) {
          best = rbase + dj;
          best_v = v;
        }
      }
    }
    y[i] = best_v;
    argmax[i] = best;
  }
}

// Grid-stride over the P * H * W inputs, one thread per input (yy, xx): the windows containing it
// are oy in [oy_lo, oy_hi] (oy st <= yy < oy st + k, oy < Ho), likewise ox; it adds, from 0 and
// in increasing output order, the dy of those whose argmax is this input.
template <typename Index>
__global__ void max_pool_backward_kernel(float* dx, const float* dy, const int* argmax, Index n,
                                         int h, int w, int ho, int wo, int k, int st) {
  for (Index i = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    const int xx = static_cast<int>(i % w);
    const Index t = i / w;
    const int yy = static_cast<int>(t % h);
    const Index p = t / h;
    const int oy_lo = yy >= k ? (yy - k) / st + 1 : 0, oy_hi = min(yy / st, ho - 1);
    const int ox_lo = xx >= k ? (xx - k) / st + 1 : 0, ox_hi = min(xx / st, wo - 1);
    const int target = yy * w + xx;
    const size_t obase = static_cast<size_t>(p) * ho * wo;
    float s = 0.0f;
    for (int oy = oy_lo; oy <= oy_hi; ++oy) {
      for (int ox = ox_lo; ox <= ox_hi; ++ox) {
        const size_t o = obase + static_cast<size_t>(oy) * wo + ox;
        if (argmax[o] == target) s = __fadd_rn(s, dy[o]);
      }
    }
    dx[i] = s;
  }
}

// ---- time embedding ------------------------------------------------------------------------

// Grid-stride over the B * half (image, frequency) pairs, one thread per pair writing its sin
// (column i) and cos (column half + i). log_mp = ln(max_period), taken on the host as the CPU
// does.
__global__ void timestep_embedding_kernel(float* out, const float* t, int b, int half,
                                          double log_mp) {
  const size_t n = static_cast<size_t>(b) * half;
  for (size_t idx = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t img = idx / half;
    const int i = static_cast<int>(idx % half);
    const double f =
        half > 1 ? exp(-log_mp * static_cast<double>(i) / static_cast<double>(half - 1)) : 1.0;
    const double a = static_cast<double>(t[img]) * f;
    float* o = out + img * 2 * half;
    o[i] = static_cast<float>(sin(a));
    o[half + i] = static_cast<float>(cos(a));
  }
}

// ---- strided copies ------------------------------------------------------------------------

constexpr int kMaxDims = 8;

// Shape and strides (in elements), passed to the kernel by value (kernel parameter space).
struct StridedLayout {
  int dims = 0;
  int64_t shape[kMaxDims] = {};
  int64_t src[kMaxDims] = {};
  int64_t dst[kMaxDims] = {};
};

// Grid-stride over the numel destination elements, one thread per element: its index is split
// over the shape (last dimension fastest) into the source offset (and, unless kDstContiguous, the
// destination offset). Unrolled over kMaxDims so the layout stays in parameter space.
template <typename T, typename Index, bool kDstContiguous>
__global__ void strided_copy_kernel(T* dst, const T* src, Index n, StridedLayout l) {
  for (Index i = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    Index rem = i;
    int64_t so = 0, dof = 0;
#pragma unroll
    for (int d = kMaxDims - 1; d >= 0; --d) {
      if (d < l.dims) {
        const Index size = static_cast<Index>(l.shape[d]);
        const int64_t idx = static_cast<int64_t>(rem % size);
        rem /= size;
        so += idx * l.src[d];
        if constexpr (!kDstContiguous) dof += idx * l.dst[d];
      }
    }
    if constexpr (kDstContiguous) {
      dst[i] = src[so];
    } else {
      dst[dof] = src[so];
    }
  }
}

template <typename T, typename Index>
void launch_strided(void* dst, const void* src, size_t n, const StridedLayout& l,
                    bool dst_contiguous, cudaStream_t stream) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  if (dst_contiguous) {
    strided_copy_kernel<T, Index, true>
        <<<grid_for(n), kThreads, 0, stream>>>(d, s, static_cast<Index>(n), l);
  } else {
    strided_copy_kernel<T, Index, false>
        <<<grid_for(n), kThreads, 0, stream>>>(d, s, static_cast<Index>(n), l);
  }
  STARLING_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_strided_elem(void* dst, const void* src, size_t n, const StridedLayout& l,
                         bool dst_contiguous, cudaStream_t stream) {
  if (small_index(n)) {
    launch_strided<T, uint32_t>(dst, src, n, l, dst_contiguous, stream);
  } else {
    launch_strided<T, uint64_t>(dst, src, n, l, dst_contiguous, stream);
  }
}

void strided_copy_impl(void* dst, const int64_t* dst_strides, const void* src,
                       const int64_t* src_strides, int dims, const int64_t* shape,
                       size_t elem_bytes, cudaStream_t stream) {
  STARLING_IMAGE_REQUIRE(dims >= 0 && dims <= kMaxDims);
  STARLING_IMAGE_REQUIRE(elem_bytes == 1 || elem_bytes == 2 || elem_bytes == 4 || elem_bytes == 8);
  StridedLayout l;
  l.dims = dims;
  size_t n = 1;
  for (int d = 0; d < dims; ++d) {
    STARLING_IMAGE_REQUIRE(shape[d] >= 0);
    l.shape[d] = shape[d];
    l.src[d] = src_strides[d];
    n *= static_cast<size_t>(shape[d]);
  }
  if (n == 0) return;
  // A destination with the contiguous strides of shape takes the cheap path.
  bool dst_contiguous = true;
  if (dst_strides != nullptr) {
    int64_t expect = 1;
    for (int d = dims - 1; d >= 0; --d) {
      l.dst[d] = dst_strides[d];
      if (shape[d] != 1 && dst_strides[d] != expect) dst_contiguous = false;
      expect *= shape[d];
    }
  }
  switch (elem_bytes) {
    case 1:
      launch_strided_elem<uint8_t>(dst, src, n, l, dst_contiguous, stream);
      break;
    case 2:
      launch_strided_elem<uint16_t>(dst, src, n, l, dst_contiguous, stream);
      break;
    case 4:
      launch_strided_elem<uint32_t>(dst, src, n, l, dst_contiguous, stream);
      break;
    default:
      launch_strided_elem<uint64_t>(dst, src, n, l, dst_contiguous, stream);
      break;
  }
}

// ---- sum -----------------------------------------------------------------------------------

// Grid: kSumBlocks blocks of kThreads, grid-stride over x; each block's double sum into
// partial[block].
__global__ void sum_partial_kernel(double* partial, const float* x, size_t n) {
  double acc[1] = {0.0};
  for (size_t i = blockIdx.x * static_cast<size_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<size_t>(kSumBlocks) * kThreads) {
    acc[0] += static_cast<double>(x[i]);
  }
  block_sum_doubles(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc[0];
}

// Grid: one block of kThreads adding the kSumBlocks partials (thread i: partials i, i + kThreads,
// ...; then the block tree). Writes the double total and/or float(float(total) * factor).
__global__ void sum_final_kernel(double* out_d, float* out_f, const double* partial, float factor) {
  double acc[1] = {0.0};
  for (int i = threadIdx.x; i < kSumBlocks; i += kThreads) acc[0] += partial[i];
  block_sum_doubles(acc);
  if (threadIdx.x == 0) {
    if (out_d != nullptr) *out_d = acc[0];
    if (out_f != nullptr) *out_f = __fmul_rn(static_cast<float>(acc[0]), factor);
  }
}

void launch_sum(double* out_d, float* out_f, double* scratch, const float* x, size_t n,
                float factor, cudaStream_t stream) {
  sum_partial_kernel<<<kSumBlocks, kThreads, 0, stream>>>(scratch, x, n);
  STARLING_CUDA_CHECK_LAUNCH();
  sum_final_kernel<<<1, kThreads, 0, stream>>>(out_d, out_f, scratch, factor);
  STARLING_CUDA_CHECK_LAUNCH();
}

// ---- SGD -----------------------------------------------------------------------------------

// Grid-stride over n values, one thread per value: optimizer.cc's Sgd::step in float.
__global__ void sgd_kernel(float* p, const float* g, float* v, size_t n, float lr, float mom,
                           float wd, bool nesterov, bool first) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float pi = p[i];
    float d = __fadd_rn(g[i], __fmul_rn(wd, pi));
    if (mom != 0.0f) {
      const float vi = first ? d : __fadd_rn(__fmul_rn(mom, v[i]), d);
      v[i] = vi;
      d = nesterov ? __fadd_rn(d, __fmul_rn(mom, vi)) : vi;
    }
    p[i] = __fsub_rn(pi, __fmul_rn(lr, d));
  }
}

// Blocks of up to 1024 threads per launch dimension x.
int blocks_for(long long n, int threads) {
  const long long blocks = (n + threads - 1) / threads;
  return static_cast<int>(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

}  // namespace

// ---- launchers -----------------------------------------------------------------------------

void group_norm_forward(float* y, double* mean, double* rstd, const float* x, const float* shift,
                        const float* weight, const float* bias, int b, int c, int s, int groups,
                        float eps, bool silu, cudaStream_t stream) {
  STARLING_IMAGE_REQUIRE(groups >= 1 && c % groups == 0);
  STARLING_IMAGE_REQUIRE(static_cast<long long>(c / groups) * s <= INT_MAX);
  const long long rows = static_cast<long long>(b) * groups;
  if (rows == 0) return;
  STARLING_IMAGE_REQUIRE(rows <= INT_MAX);
  group_norm_forward_kernel<<<static_cast<int>(rows), kThreads, 0, stream>>>(
      y, mean, rstd, x, shift, weight, bias, c, s, groups, static_cast<double>(eps), silu);
  STARLING_CUDA_CHECK_LAUNCH();
}

size_t group_norm_scratch_floats(int b, int c) {
  // sg, sgx, sx: three (B, C) arrays of doubles.
  return 3 * 2 * static_cast<size_t>(b) * static_cast<size_t>(c);
}

void group_norm_backward(float* dx, float* dweight, float* dbias, float* dshift, const float* dy,
                         const float* x, const float* shift, const float* weight, const float* bias,
                         const double* mean, const double* rstd, int b, int c, int s, int groups,
                         bool silu, float* scratch, cudaStream_t stream) {
  STARLING_IMAGE_REQUIRE(groups >= 1 && c % groups == 0);
  STARLING_IMAGE_REQUIRE(static_cast<long long>(c / groups) * s <= INT_MAX);
  STARLING_IMAGE_REQUIRE(reinterpret_cast<uintptr_t>(scratch) % alignof(double) == 0);
  if (c == 0) return;
  const size_t planes = static_cast<size_t>(b) * c;
  double* sg = reinterpret_cast<double*>(scratch);
  double* sgx = sg + planes;
  double* sx = (shift != nullptr && dshift != nullptr) ? sgx + planes : nullptr;
  if (planes > 0) {
    STARLING_IMAGE_REQUIRE(planes <= INT_MAX);
    int threads = 32;
    while (threads < kThreads && threads < s) threads *= 2;
    group_norm_channel_sums_kernel<<<static_cast<int>(planes), threads, 0, stream>>>(
        sg, sgx, sx, dy, x, shift, weight, bias, mean, rstd, c, s, groups, silu);
    STARLING_CUDA_CHECK_LAUNCH();
    group_norm_dx_kernel<<<b * groups, kThreads, 0, stream>>>(
        dx, dshift, sg, sgx, sx, dy, x, shift, weight, bias, mean, rstd, c, s, groups, silu);
    STARLING_CUDA_CHECK_LAUNCH();
  }
  if (dweight != nullptr || dbias != nullptr) {
    group_norm_params_kernel<<<blocks_for(c, kThreads), kThreads, 0, stream>>>(dweight, dbias, sg,
                                                                               sgx, b, c);
    STARLING_CUDA_CHECK_LAUNCH();
  }
}

void silu_forward(float* y, const float* x, size_t n, cudaStream_t stream) {
  launch_pointwise<Pointwise::kSiluFwd>(y, x, nullptr, n, stream);
}

void silu_backward(float* dx, const float* dy, const float* x, size_t n, cudaStream_t stream) {
  launch_pointwise<Pointwise::kSiluBwd>(dx, dy, x, n, stream);
}

void relu_forward(float* y, const float* x, size_t n, cudaStream_t stream) {
  launch_pointwise<Pointwise::kReluFwd>(y, x, nullptr, n, stream);
}

void relu_backward(float* dx, const float* dy, const float* x, size_t n, cudaStream_t stream) {
  launch_pointwise<Pointwise::kReluBwd>(dx, dy, x, n, stream);
}

void upsample_nearest2d_forward(float* y, const float* x, int planes, int h, int w, int factor,
                                cudaStream_t stream) {
  STARLING_IMAGE_REQUIRE(factor >= 1 && planes >= 0 && h >= 0 && w >= 0);
  const size_t n = static_cast<size_t>(planes) * h * w * factor * factor;
  if (n == 0) return;
  if (small_index(n)) {
    upsample_forward_kernel<uint32_t>
        <<<grid_for(n), kThreads, 0, stream>>>(y, x, static_cast<uint32_t>(n), h, w, factor);
  } else {
    upsample_forward_kernel<uint64_t><<<grid_for(n), kThreads, 0, stream>>>(y, x, n, h, w, factor);
  }
  STARLING_CUDA_CHECK_LAUNCH();
}

void upsample_nearest2d_backward(float* dx, const float* dy, int planes, int h, int w, int factor,
                                 cudaStream_t stream) {
  STARLING_IMAGE_REQUIRE(factor >= 1 && planes >= 0 && h >= 0 && w >= 0);
  const size_t n = static_cast<size_t>(planes) * h * w;
  if (n == 0) return;
  if (small_index(n)) {
    upsample_backward_kernel<uint32_t>
        <<<grid_for(n), kThreads, 0, stream>>>(dx, dy, static_cast<uint32_t>(n), h, w, factor);
  } else {
    upsample_backward_kernel<uint64_t>
        <<<grid_for(n), kThreads, 0, stream>>>(dx, dy, n, h, w, factor);
  }
  STARLING_CUDA_CHECK_LAUNCH();
}

void max_pool2d_forward(float* y, int* argmax, const float* x, int planes, int h, int w, int k,
                        int st, cudaStream_t stream) {
  if (st <= 0) st = k;
  STARLING_IMAGE_REQUIRE(k >= 1 && k <= h && k <= w && planes >= 0);
  const int ho = (h - k) / st + 1, wo = (w - k) / st + 1;
  const size_t n = static_cast<size_t>(planes) * ho * wo;
  if (n == 0) return;
  if (small_index(n)) {
    max_pool_forward_kernel<uint32_t><<<grid_for(n), kThreads, 0, stream>>>(
        y, argmax, x, static_cast<uint32_t>(n), h, w, ho, wo, k, st);
  } else {
    max_pool_forward_kernel<uint64_t>
        <<<grid_for(n), kThreads, 0, stream>>>(y, argmax, x, n, h, w, ho, wo, k, st);
  }
  STARLING_CUDA_CHECK_LAUNCH();
}

void max_pool2d_backward(float* dx, const float* dy, const int* argmax, int planes, int h, int w,
                         int k, int st, cudaStream_t stream) {
  if (st <= 0) st = k;
  STARLING_IMAGE_REQUIRE(k >= 1 && k <= h && k <= w && planes >= 0);
  const int ho = (h - k) / st + 1, wo = (w - k) / st + 1;
  const size_t n = static_cast<size_t>(planes) * h * w;
  if (n == 0) return;
  if (small_index(n)) {
    max_pool_backward_kernel<uint32_t><<<grid_for(n), kThreads, 0, stream>>>(
        dx, dy, argmax, static_cast<uint32_t>(n), h, w, ho, wo, k, st);
  } else {
    max_pool_backward_kernel<uint64_t>
        <<<grid_for(n), kThreads, 0, stream>>>(dx, dy, argmax, n, h, w, ho, wo, k, st);
  }
  STARLING_CUDA_CHECK_LAUNCH();
}

void timestep_embedding(float* out, const float* t, int b, int dim, float max_period,
                        cudaStream_t stream) {
  STARLING_IMAGE_REQUIRE(dim >= 2 && dim % 2 == 0 && b >= 0);
  const size_t n = static_cast<size_t>(b) * (dim / 2);
  if (n == 0) return;
  timestep_embedding_kernel<<<grid_for(n), kThreads, 0, stream>>>(
      out, t, b, dim / 2, std::log(static_cast<double>(max_period)));
  STARLING_CUDA_CHECK_LAUNCH();
}

void strided_copy(void* dst, const void* src_base, int dims, const int64_t* shape,
                  const int64_t* strides, size_t elem_bytes, cudaStream_t stream) {
  strided_copy_impl(dst, nullptr, src_base, strides, dims, shape, elem_bytes, stream);
}

void strided_copy_to(void* dst_base, const int64_t* dst_strides, const void* src_base,
                     const int64_t* src_strides, int dims, const int64_t* shape, size_t elem_bytes,
                     cudaStream_t stream) {
  strided_copy_impl(dst_base, dst_strides, src_base, src_strides, dims, shape, elem_bytes, stream);
}

void add(float* out, const float* a, const float* b, size_t n, cudaStream_t stream) {
  launch_pointwise<Pointwise::kAdd>(out, a, b, n, stream);
}

void sub(float* out, const float* a, const float* b, size_t n, cudaStream_t stream) {
  launch_pointwise<Pointwise::kSub>(out, a, b, n, stream);
}

void mul(float* out, const float* a, const float* b, size_t n, cudaStream_t stream) {
  launch_pointwise<Pointwise::kMul>(out, a, b, n, stream);
}

void scale(float* out, const float* a, float s, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  scale_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, a, s, n);
  STARLING_CUDA_CHECK_LAUNCH();
}

void ema_lerp(float* ema, const float* w, float d, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  ema_lerp_kernel<<<grid_for(n), kThreads, 0, stream>>>(ema, w, d, 1.0f - d, n);
  STARLING_CUDA_CHECK_LAUNCH();
}

void fill(float* out, float v, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  fill_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, v, n);
  STARLING_CUDA_CHECK_LAUNCH();
}

void accumulate(float* dst, const float* src, size_t n, cudaStream_t stream) {
  launch_pointwise<Pointwise::kAccumulate>(dst, dst, src, n, stream);
}

void sum(float* out, double* scratch, const float* x, size_t n, double factor,
         cudaStream_t stream) {
  launch_sum(nullptr, out, scratch, x, n, static_cast<float>(factor), stream);
}

void sum_double(double* out, double* scratch, const float* x, size_t n, cudaStream_t stream) {
  launch_sum(out, nullptr, scratch, x, n, 1.0f, stream);
}

void sgd_step(float* params, const float* grads, float* velocity, size_t n, float lr,
              float momentum, float weight_decay, bool nesterov, bool first_step,
              cudaStream_t stream) {
  STARLING_IMAGE_REQUIRE(momentum == 0.0f || velocity != nullptr);
  if (n == 0) return;
  sgd_kernel<<<grid_for(n), kThreads, 0, stream>>>(params, grads, velocity, n, lr, momentum,
                                                   weight_decay, nesterov, first_step);
  STARLING_CUDA_CHECK_LAUNCH();
}

}  // namespace starling::cuda
