// Matmul and linear through cuBLAS. cuBLAS is column-major: a row-major C = op(A) op(B) is the
// column-major C^T = op(B)^T op(A)^T, so every call swaps the operands and m with n.
#include <mutex>

#include "core/cuda/check.h"
#include "core/cuda/internal/column_sums.cuh"
#include "core/cuda/internal/reduce.cuh"
#include "core/cuda/kernels.h"

namespace starling::cuda {
namespace {

// Partial column sums of one slice of rows: part[slice][j] = sum over the slice's rows i of
// in[i, j]. Block (32, kRowLanes): rows strided over threadIdx.y, partial sums added in y order
// (deterministic); grid (column blocks, slices) as internal::row_slices chooses.
constexpr int kRowLanes = 16;
__global__ void column_sums_kernel(float* part, const float* in, int rows, int cols,
                                   int rows_per_slice) {
  __shared__ float lanes[kRowLanes][33];
  const int j = blockIdx.x * 32 + threadIdx.x;
  const int begin = blockIdx.y * rows_per_slice;
  const int end = min(rows, begin + rows_per_slice);
  float s = 0.0f;
  if (j < cols) {
    for (int i = begin + threadIdx.y; i < end; i += kRowLanes) {
      s += in[static_cast<size_t>(i) * cols + j];
    }
  }
  lanes[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    float t = 0.0f;
    for (int y = 0; y < kRowLanes; ++y) t += lanes[y][threadIdx.x];
    part[static_cast<size_t>(blockIdx.y) * cols + j] = t;
  }
}

__global__ void column_partials_sum_kernel(float* out, const float* part, int slices, int cols) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float t = 0.0f;
  for (int s = 0; s < slices; ++s) t += part[static_cast<size_t>(s) * cols + j];
  out[j] = t;
}

__global__ void to_bf16_kernel(__nv_bfloat16* out, const float* in, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(in[i]);
  }
}

__global__ void add_bias_kernel(float* y, const float* bias, size_t n, int cols) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    y[i] += bias[i % cols];
  }
}

}  // namespace

void gemm_strided_batched(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                          const float* a, int lda, long long stride_a, const float* b, int ldb,
                          long long stride_b, float beta, float* c, int ldc, long long stride_c,
                          int batch, cublasHandle_t handle, cudaStream_t stream) {
  STARLING_CUBLAS_CHECK(cublasSetStream(handle, stream));
  STARLING_CUBLAS_CHECK(cublasSgemmStridedBatched(
      handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
      &alpha, b, ldb, stride_b, a, lda, stride_a, &beta, c, ldc, stride_c, batch));
}

namespace {
void gemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a, int lda, const float* b,
          int ldb, float* c, int ldc, cublasHandle_t handle, cudaStream_t stream) {
  gemm_strided_batched(trans_a, trans_b, m, n, k, 1.0f, a, lda, 0, b, ldb, 0, 0.0f, c, ldc, 0, 1,
                       handle, stream);
}
}  // namespace

void matmul_forward(float* c, const float* a, const float* b, int m, int n, int k,
                    cublasHandle_t handle, cudaStream_t stream) {
  gemm(false, false, m, n, k, a, k, b, n, c, n, handle, stream);
}

void matmul_backward(float* da, float* db, const float* dc, const float* a, const float* b, int m,
                     int n, int k, cublasHandle_t handle, cudaStream_t stream) {
  if (da != nullptr) gemm(false, true, m, k, n, dc, n, b, n, da, k, handle, stream);
  if (db != nullptr) gemm(true, false, k, n, m, a, k, dc, n, db, n, handle, stream);
}

namespace {
int grid_for(size_t n) {
  const long long blocks = (static_cast<long long>(n) + 255) / 256;
  return static_cast<int>(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

void add_bias(float* y, const float* bias, int n, int out, cudaStream_t stream) {
  if (bias == nullptr || n <= 0) return;
  const size_t total = static_cast<size_t>(n) * out;
  add_bias_kernel<<<grid_for(total), 256, 0, stream>>>(y, bias, total, out);
  STARLING_CUDA_CHECK_LAUNCH();
}

void column_sums(float* out, const float* in, int rows, int cols, cudaStream_t stream) {
  if (out == nullptr || cols <= 0) return;
  if (rows <= 0) {
    STARLING_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(cols) * sizeof(float), stream));
    return;
  }
  const internal::RowSlices sl = internal::row_slices(rows, cols);
  float* part = internal::partials_alloc(static_cast<size_t>(sl.slices) * cols, stream);
  column_sums_kernel<<<dim3(internal::ceil_div(cols, 32), sl.slices), dim3(32, kRowLanes), 0,
                       stream>>>(part, in, rows, cols, sl.rows_per_slice);
  STARLING_CUDA_CHECK_LAUNCH();
  internal::column_partials_sum(out, part, sl.slices, cols, stream);
  STARLING_CUDA_CHECK(cudaFreeAsync(part, stream));
}

__nv_bfloat16* to_bf16(__nv_bfloat16* dst, const float* src, size_t n, cudaStream_t stream) {
  if (n > 0) {
    to_bf16_kernel<<<grid_for(n), 256, 0, stream>>>(dst, src, n);
    STARLING_CUDA_CHECK_LAUNCH();
  }
  return dst;
}

// Row-major c (fp32) = op(a) op(b) with a, b in bf16 and fp32 accumulation (tensor cores under
// the handle's default math mode, make_cublas).
void gemm_bf16(bool trans_a, bool trans_b, int m, int n, int k, const __nv_bfloat16* a, int lda,
               const __nv_bfloat16* b, int ldb, float* c, int ldc, cublasHandle_t handle,
               cudaStream_t stream) {
  const float one = 1.0f, zero = 0.0f;
  STARLING_CUBLAS_CHECK(cublasSetStream(handle, stream));
  STARLING_CUBLAS_CHECK(cublasGemmEx(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                     trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &one, b,
                                     CUDA_R_16BF, ldb, a, CUDA_R_16BF, lda, &zero, c, CUDA_R_32F,
                                     ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
}  // namespace

size_t linear_bf16_scratch_elems(int n, int in, int out) {
  return static_cast<size_t>(n) * in + static_cast<size_t>(out) * in + static_cast<size_t>(n) * out;
}

void linear_forward_bf16(float* y, const float* x, const float* weight, const float* bias, int n,
                         int in, int out, __nv_bfloat16* scratch, cublasHandle_t handle,
                         cudaStream_t stream) {
  __nv_bfloat16* xb = to_bf16(scratch, x, static_cast<size_t>(n) * in, stream);
  __nv_bfloat16* wb =
      to_bf16(scratch + static_cast<size_t>(n) * in, weight, static_cast<size_t>(out) * in, stream);
  gemm_bf16(false, true, n, out, in, xb, in, wb, in, y, out, handle, stream);
  add_bias(y, bias, n, out, stream);
}

void linear_backward_bf16(float* dx, float* dweight, float* dbias, const float* dy, const float* x,
                          const float* weight, int n, int in, int out, __nv_bfloat16* scratch,
                          cublasHandle_t handle, cudaStream_t stream) {
  __nv_bfloat16* xb = to_bf16(scratch, x, static_cast<size_t>(n) * in, stream);
  __nv_bfloat16* wb =
      to_bf16(scratch + static_cast<size_t>(n) * in, weight, static_cast<size_t>(out) * in, stream);
  __nv_bfloat16* dyb =
      to_bf16(scratch + static_cast<size_t>(n) * in + static_cast<size_t>(out) * in, dy,
              static_cast<size_t>(n) * out, stream);
  if (dx != nullptr) gemm_bf16(false, false, n, in, out, dyb, out, wb, in, dx, in, handle, stream);
  if (dweight != nullptr) {
    gemm_bf16(true, false, out, in, n, dyb, out, xb, in, dweight, in, handle, stream);
  }
  column_sums(dbias, dy, n, out, stream);  // from fp32 dy, as the CPU backend does
}

void linear_forward(float* y, const float* x, const float* weight, const float* bias, int n, int in,
                    int out, cublasHandle_t handle, cudaStream_t stream) {
  gemm(false, true, n, out, in, x, in, weight, in, y, out, handle, stream);
  add_bias(y, bias, n, out, stream);
}

void linear_backward(float* dx, float* dweight, float* dbias, const float* dy, const float* x,
                     const float* weight, int n, int in, int out, cublasHandle_t handle,
                     cudaStream_t stream) {
  if (dx != nullptr) gemm(false, false, n, in, out, dy, out, weight, in, dx, in, handle, stream);
  if (dweight != nullptr)
    gemm(true, false, out, in, n, dy, out, x, in, dweight, in, handle, stream);
  column_sums(dbias, dy, n, out, stream);
}

namespace internal {
float* partials_alloc(size_t n, cudaStream_t stream) {
  static std::once_flag keep[64];
  int device = 0;
  STARLING_CUDA_CHECK(cudaGetDevice(&device));
  if (device >= 0 && device < 64) {
    std::call_once(keep[device], [device] {
      cudaMemPool_t pool = nullptr;
      STARLING_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
      unsigned long long keep_all = ~0ull;
      STARLING_CUDA_CHECK(
          cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
    });
  }
  void* p = nullptr;
  STARLING_CUDA_CHECK(cudaMallocAsync(&p, n * sizeof(float), stream));
  return static_cast<float*>(p);
}

void column_partials_sum(float* out, const float* part, int slices, int cols, cudaStream_t stream) {
  column_partials_sum_kernel<<<ceil_div(cols, 256), 256, 0, stream>>>(out, part, slices, cols);
  STARLING_CUDA_CHECK_LAUNCH();
}
}  // namespace internal

}  // namespace starling::cuda
