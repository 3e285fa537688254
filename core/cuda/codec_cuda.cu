// CUDA update codec kernels: int8 blockwise, exact top-k (histogram + CUB radix sort),
// gather/scatter for top-k and random-k, PowerSGD through cuBLAS. The entry points over
// EncodedUpdate are in codec_gpu.cc (C++20 host code; nvcc compiles this file as C++17). Arithmetic
// that must match the CPU bit for bit uses the _rn intrinsics: nvcc would otherwise contract a * b
// + c into one FMA, which rounds once where the CPU rounds twice.
#include <algorithm>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>

#include "core/cuda/check.h"
#include "core/cuda/codec_kernels.h"

namespace starling::cuda {

namespace {

constexpr int kThreads = 256;

int grid_for(size_t n) {
  const long long blocks = (static_cast<long long>(n) + kThreads - 1) / kThreads;
  return static_cast<int>(std::clamp<long long>(blocks, 1, 65535 * 16));
}

__device__ inline uint32_t abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// rne(r) as int8 for |r| <= 127 (1 + 2^-23). A block whose 127 / absmax overflows (absmax below
// 127 / FLT_MAX) gives r = inf or NaN, whose conversion to int the scalar CPU path leaves
// undefined (x86: cvttss2si, INT_MIN, low byte 0; the AVX2 path saturates to -128): 0 here.
__device__ inline int8_t to_i8(float r) {
  return fabsf(r) <= 128.0f ? static_cast<int8_t>(__float2int_rn(r)) : int8_t{0};
}

// One warp per int8 block: the absmax as integer bits (monotone, inf/NaN above infinity's),
// then the codes. Warp-uniform loops, so the shuffles see every lane.
__global__ void int8_encode_kernel(int8_t* q, float* scales, unsigned* nonfinite, const float* x,
                                   size_t n, size_t block, size_t nblocks) {
  const size_t warps = blockDim.x / 32;
  const unsigned lane = threadIdx.x % 32;
  for (size_t b = blockIdx.x * warps + threadIdx.x / 32; b < nblocks;
       b += static_cast<size_t>(gridDim.x) * warps) {
    const size_t start = b * block, end = start + block < n ? start + block : n;
    uint32_t m = 0;
    for (size_t i = start + lane; i < end; i += 32) m = max(m, abs_bits(x[i]));
    for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (m >= 0x7f800000u) {
      if (lane == 0) atomicOr(nonfinite, 1u);
      continue;
    }
    const float amax = __uint_as_float(m);
    const float inv = amax > 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
    if (lane == 0) scales[b] = __fdiv_rn(amax, 127.0f);
    for (size_t i = start + lane; i < end; i += 32) q[i] = to_i8(__fmul_rn(x[i], inv));
  }
}

__global__ void int8_decode_add_kernel(float* dst, const int8_t* q, const float* scales, size_t n,
                                       size_t block, float scale_mul, float weight) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float s = __fmul_rn(scales[i / block], scale_mul);
    const float v = __fmul_rn(static_cast<float>(q[i]), s);
    dst[i] = __fadd_rn(dst[i], __fmul_rn(weight, v));
  }
}

__global__ void nonfinite_kernel(unsigned* flag, const float* x, size_t n) {
  unsigned bad = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    bad |= abs_bits(x[i]) >= 0x7f800000u ? 1u : 0u;
  }
  if (__any_sync(0xffffffffu, bad != 0) && threadIdx.x % 32 == 0) atomicOr(flag, 1u);
}

__global__ void add_vectors_kernel(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = __fadd_rn(a[i], b[i]);
  }
}

__global__ void gather_kernel(float* values, const uint32_t* idx, size_t k, const float* x) {
  for (size_t j = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; j < k;
       j += static_cast<size_t>(gridDim.x) * blockDim.x) {
    values[j] = x[idx[j]];
  }
}

__global__ void scatter_add_kernel(float* dst, const uint32_t* idx, const float* values, size_t k,
                                   float weight) {
  for (size_t j = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; j < k;
       j += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint32_t i = idx[j];
    dst[i] = __fadd_rn(dst[i], __fmul_rn(weight, values[j]));
  }
}

__global__ void randk_scatter_add_kernel(float* dst, const uint32_t* idx, const float* values,
                                         int64_t k, int64_t base, int64_t extra, float weight) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < k;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float size = static_cast<float>(base + (j < extra ? 1 : 0));
    const uint32_t i = idx[j];
    dst[i] = __fadd_rn(dst[i], __fmul_rn(weight, __fmul_rn(values[j], size)));
  }
}

// Top-k histogram: bin = |x| bits >> 20 (exponent and top 3 mantissa bits; inf and NaN land in
// the last bins), counted per block in shared memory, then added to hist; and the non-finite flag.
constexpr int kTopkShift = 20;
constexpr int kTopkBins = 1 << (31 - kTopkShift);

__global__ void topk_histogram_kernel(uint32_t* hist, unsigned* nonfinite, const float* x,
                                      size_t n) {
  __shared__ uint32_t local[kTopkBins];
  for (int b = threadIdx.x; b < kTopkBins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  unsigned bad = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint32_t a = abs_bits(x[i]);
    atomicAdd(&local[a >> kTopkShift], 1u);
    bad |= a >= 0x7f800000u ? 1u : 0u;
  }
  __syncthreads();
  for (int b = threadIdx.x; b < kTopkBins; b += blockDim.x) {
    if (local[b] != 0) atomicAdd(&hist[b], local[b]);
  }
  if (__any_sync(0xffffffffu, bad != 0) && threadIdx.x % 32 == 0) atomicOr(nonfinite, 1u);
}

// flags[i] = (x[i] in bin min_bin or above), idx[i] = i.
__global__ void topk_flag_kernel(uint8_t* flags, uint32_t* idx, const float* x, size_t n,
                                 uint32_t min_bin) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    flags[i] = (abs_bits(x[i]) >> kTopkShift) >= min_bin ? 1 : 0;
    idx[i] = static_cast<uint32_t>(i);
  }
}

// keys[j] = |x[idx[j]]| bits.
__global__ void topk_keys_kernel(uint32_t* keys, const uint32_t* idx, const float* x, size_t m) {
  for (size_t j = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; j < m;
       j += static_cast<size_t>(gridDim.x) * blockDim.x) {
    keys[j] = abs_bits(x[idx[j]]);
  }
}

__global__ void powersgd_decode_add_kernel(float* dst, const float* p, const float* qt,
                                           int64_t rows, int64_t cols, int rank, float weight) {
  const int64_t total = rows * cols;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / cols, j = e % cols;
    const float* pi = p + i * rank;
    float v = __fmul_rn(pi[0], qt[j]);
    for (int c = 1; c < rank; ++c) v = __fadd_rn(v, __fmul_rn(pi[c], qt[c * cols + j]));
    dst[e] = __fadd_rn(dst[e], __fmul_rn(weight, v));
  }
}

}  // namespace

// ---- Launchers ----

void int8_encode(int8_t* q, float* scales, unsigned* nonfinite, const float* x, size_t n, int block,
                 cudaStream_t stream) {
  if (n == 0) return;
  const size_t b = static_cast<size_t>(block);
  const size_t nblocks = (n + b - 1) / b;
  const size_t warps = kThreads / 32;
  const long long grid = static_cast<long long>((nblocks + warps - 1) / warps);
  int8_encode_kernel<<<static_cast<int>(std::min<long long>(grid, 65535 * 16)), kThreads, 0,
                       stream>>>(q, scales, nonfinite, x, n, b, nblocks);
  STARLING_CUDA_CHECK_LAUNCH();
}

void int8_decode_add(float* dst, const int8_t* q, const float* scales, size_t n, int block,
                     float scale_mul, float weight, cudaStream_t stream) {
  if (n == 0) return;
  int8_decode_add_kernel<<<grid_for(n), kThreads, 0, stream>>>(
      dst, q, scales, n, static_cast<size_t>(block), scale_mul, weight);
  STARLING_CUDA_CHECK_LAUNCH();
}

void nonfinite_check(unsigned* flag, const float* x, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  nonfinite_kernel<<<grid_for(n), kThreads, 0, stream>>>(flag, x, n);
  STARLING_CUDA_CHECK_LAUNCH();
}

void add_vectors(float* out, const float* a, const float* b, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_vectors_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, a, b, n);
  STARLING_CUDA_CHECK_LAUNCH();
}

void gather(float* values, const uint32_t* idx, size_t k, const float* x, cudaStream_t stream) {
  if (k == 0) return;
  gather_kernel<<<grid_for(k), kThreads, 0, stream>>>(values, idx, k, x);
  STARLING_CUDA_CHECK_LAUNCH();
}

void scatter_add(float* dst, const uint32_t* idx, const float* values, size_t k, float weight,
                 cudaStream_t stream) {
  if (k == 0) return;
  scatter_add_kernel<<<grid_for(k), kThreads, 0, stream>>>(dst, idx, values, k, weight);
  STARLING_CUDA_CHECK_LAUNCH();
}

void randk_scatter_add(float* dst, const uint32_t* idx, const float* values, int64_t n, int64_t k,
                       float weight, cudaStream_t stream) {
  if (k <= 0) return;
  // compress::internal::Strata(n, k): the first n % k strata hold n / k + 1 elements.
  randk_scatter_add_kernel<<<grid_for(static_cast<size_t>(k)), kThreads, 0, stream>>>(
      dst, idx, values, k, n / k, n % k, weight);
  STARLING_CUDA_CHECK_LAUNCH();
}

void TopkSelector::reserve(int64_t n, cudaStream_t stream) {
  if (hist_.size() == 0) {
    hist_ = DeviceArray<uint32_t>(kTopkBins);
    selected_ = DeviceArray<int64_t>(1);
    host_hist_.resize(kTopkBins);
  }
  if (n <= capacity_) return;
  const size_t un = static_cast<size_t>(n);
  keys_in_ = DeviceArray<uint32_t>(un);
  keys_out_ = DeviceArray<uint32_t>(un);
  idx_in_ = DeviceArray<uint32_t>(un);
  idx_cand_ = DeviceArray<uint32_t>(un);
  idx_out_ = DeviceArray<uint32_t>(un);
  flags_ = DeviceArray<uint8_t>(un);
  size_t select_bytes = 0, pairs_bytes = 0, keys_bytes = 0;
  STARLING_CUDA_CHECK(cub::DeviceSelect::Flagged(nullptr, select_bytes, idx_in_.get(), flags_.get(),
                                                 idx_cand_.get(), selected_.get(), n, stream));
  STARLING_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
      nullptr, pairs_bytes, keys_in_.get(), keys_out_.get(), idx_cand_.get(), idx_out_.get(), n, 0,
      31, stream));
  STARLING_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(nullptr, keys_bytes, idx_out_.get(),
                                                     idx_in_.get(), n, 0, 32, stream));
  temp_ = DeviceArray<unsigned char>(std::max<size_t>({select_bytes, pairs_bytes, keys_bytes, 1}));
  capacity_ = n;
}

void TopkSelector::select(uint32_t* indices, unsigned* nonfinite, const float* x, int64_t n,
                          int64_t k, cudaStream_t stream) {
  if (n <= 0) return;
  reserve(n, stream);
  const size_t un = static_cast<size_t>(n);
  STARLING_CUDA_CHECK(cudaMemsetAsync(hist_.get(), 0, kTopkBins * sizeof(uint32_t), stream));
  // A few thousand elements per block: each block also clears and flushes 2048 bins.
  const int hist_grid = static_cast<int>(std::clamp<size_t>((un + 4095) / 4096, 1, 1024));
  topk_histogram_kernel<<<hist_grid, kThreads, 0, stream>>>(hist_.get(), nonfinite, x, un);
  STARLING_CUDA_CHECK_LAUNCH();
  if (k <= 0) return;
  STARLING_CUDA_CHECK(cudaMemcpyAsync(host_hist_.data(), hist_.get(), kTopkBins * sizeof(uint32_t),
                                      cudaMemcpyDeviceToHost, stream));
  STARLING_CUDA_CHECK(cudaStreamSynchronize(stream));
  // The bin holding the k-th largest |x| (as core/compress's CPU encoder finds it): every element
  // of a higher bin is kept, and the candidates are that bin and above.
  int64_t above = 0;
  int bin = kTopkBins - 1;
  while (bin > 0 && above + host_hist_[static_cast<size_t>(bin)] < k) {
    above += host_hist_[static_cast<size_t>(bin--)];
  }
  const int64_t m = above + host_hist_[static_cast<size_t>(bin)];
  topk_flag_kernel<<<grid_for(un), kThreads, 0, stream>>>(flags_.get(), idx_in_.get(), x, un,
                                                          static_cast<uint32_t>(bin));
  STARLING_CUDA_CHECK_LAUNCH();
  // Compaction keeps index order, and the radix sort is stable: among equal |x| the lower index
  // stays first, the CPU's tie rule.
  size_t bytes = temp_.size();
  STARLING_CUDA_CHECK(cub::DeviceSelect::Flagged(temp_.get(), bytes, idx_in_.get(), flags_.get(),
                                                 idx_cand_.get(), selected_.get(), n, stream));
  topk_keys_kernel<<<grid_for(static_cast<size_t>(m)), kThreads, 0, stream>>>(
      keys_in_.get(), idx_cand_.get(), x, static_cast<size_t>(m));
  STARLING_CUDA_CHECK_LAUNCH();
  bytes = temp_.size();
  STARLING_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(temp_.get(), bytes, keys_in_.get(),
                                                                keys_out_.get(), idx_cand_.get(),
                                                                idx_out_.get(), m, 0, 31, stream));
  // The k kept indices, increasing; only the bits an index below n can use are sorted.
  int bits = 1;
  while (bits < 32 && (static_cast<uint64_t>(n - 1) >> bits) != 0) ++bits;
  bytes = temp_.size();
  STARLING_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(temp_.get(), bytes, idx_out_.get(), indices, k,
                                                     0, bits, stream));
}

namespace {
// The 32-bit cuBLAS API (cublasSgemm_64 needs cuBLAS 12): a matrix side past INT_MAX is a bug in
// the caller, as a bad launch configuration would be.
void check_gemm_dims(int64_t rows, int64_t cols) {
  if (rows > INT32_MAX || cols > INT32_MAX) {
    internal::check_failed("powersgd", "a matrix side exceeds INT_MAX", __FILE__, __LINE__);
  }
}
}  // namespace

void powersgd_project(float* p, const float* m, const float* qt, int64_t rows, int64_t cols,
                      int rank, cublasHandle_t handle, cudaStream_t stream) {
  // Column-major view: P^T (rank x rows, ld rank) = (Q^T as cols x rank, ld cols)^T *
  // (M^T as cols x rows, ld cols).
  const float one = 1.0f, zero = 0.0f;
  STARLING_CUBLAS_CHECK(cublasSetStream(handle, stream));
  check_gemm_dims(rows, cols);
  const int r = static_cast<int>(rows), c = static_cast<int>(cols);
  STARLING_CUBLAS_CHECK(
      cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, rank, r, c, &one, qt, c, m, c, &zero, p, rank));
}

void powersgd_back(float* qt, const float* m, const float* p, int64_t rows, int64_t cols, int rank,
                   cublasHandle_t handle, cudaStream_t stream) {
  // Column-major view: Q (cols x rank, ld cols) = (M^T as cols x rows, ld cols) *
  // (P^T as rank x rows, ld rank)^T.
  const float one = 1.0f, zero = 0.0f;
  STARLING_CUBLAS_CHECK(cublasSetStream(handle, stream));
  check_gemm_dims(rows, cols);
  const int r = static_cast<int>(rows), c = static_cast<int>(cols);
  STARLING_CUBLAS_CHECK(
      cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_T, c, rank, r, &one, m, c, p, rank, &zero, qt, c));
}

void powersgd_decode_add(float* dst, const float* p, const float* qt, int64_t rows, int64_t cols,
                         int rank, float weight, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || rank <= 0) return;
  powersgd_decode_add_kernel<<<grid_for(static_cast<size_t>(rows * cols)), kThreads, 0, stream>>>(
      dst, p, qt, rows, cols, rank, weight);
  STARLING_CUDA_CHECK_LAUNCH();
}

}  // namespace starling::cuda
