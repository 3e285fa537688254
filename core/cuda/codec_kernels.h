// CUDA update codecs (issue 4): host launchers of the codec kernels, on device pointers and a
// stream. Their CPU oracles are in core/compress/internal/kernels.h; the entry points over
// EncodedUpdate are in codec_gpu.h. C++17 (nvcc compiles it), CUDA builds only.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/cuda/handles.h"

namespace starling::cuda {

// Enqueued on `stream`; nothing synchronizes.

// Blockwise absmax int8, bit-identical to compress::internal::quantize_int8_scalar:
// x: (n) -> q: (n), scales: (ceil(n / block)), scale = absmax / 127, q = rne(x * (127 / absmax)).
// A block holding inf or NaN sets *nonfinite to nonzero (its q and scale are then meaningless);
// *nonfinite is never cleared here. REQUIRES: block >= 1.
void int8_encode(int8_t* q, float* scales, unsigned* nonfinite, const float* x, size_t n, int block,
                 cudaStream_t stream);
// dst[i] = dst[i] + weight * (q[i] * (scales[i / block] * scale_mul)), each operation rounded
// once (no FMA): compress::internal::add_i8 bit for bit. scale_mul is 1 for int8, 1 / levels for
// QSGD. dst, q: (n), scales: (ceil(n / block)).
void int8_decode_add(float* dst, const int8_t* q, const float* scales, size_t n, int block,
                     float scale_mul, float weight, cudaStream_t stream);

// *flag |= nonzero when x: (n) holds inf or NaN.
void nonfinite_check(unsigned* flag, const float* x, size_t n, cudaStream_t stream);
// out[i] = a[i] + b[i] (rounded once). out may alias a or b.
void add_vectors(float* out, const float* a, const float* b, size_t n, cudaStream_t stream);

// values[j] = x[idx[j]] for j < k.
void gather(float* values, const uint32_t* idx, size_t k, const float* x, cudaStream_t stream);
// dst[idx[j]] = dst[idx[j]] + weight * values[j]. REQUIRES: idx distinct (no atomics).
void scatter_add(float* dst, const uint32_t* idx, const float* values, size_t k, float weight,
                 cudaStream_t stream);
// Random-k decode: dst[idx[j]] += weight * (values[j] * size_j), size_j the size of stratum j of
// compress::internal::Strata(n, k) (as a float). REQUIRES: idx distinct, k >= 1.
void randk_scatter_add(float* dst, const uint32_t* idx, const float* values, int64_t n, int64_t k,
                       float weight, cudaStream_t stream);

// Exact top-k by magnitude: the k indices of x: (n) with the largest |x| (ties: lowest index
// first), written increasing to indices: (k). A 2048-bin histogram of the top bits of |x| (read on
// the host: select synchronizes `stream` once) finds the bin holding the k-th largest; the
// elements in that bin and above are compacted in index order, sorted by a stable descending radix
// sort of their |x| bits, and the first k indices sorted increasing. Scratch is grown on first
// use of a larger n. Sets *nonfinite when x holds inf or NaN. REQUIRES: 0 <= k <= n < 2^32.
class TopkSelector {
 public:
  void select(uint32_t* indices, unsigned* nonfinite, const float* x, int64_t n, int64_t k,
              cudaStream_t stream);
  // Grows the scratch for tensors of up to n elements (select does it when needed).
  void reserve(int64_t n, cudaStream_t stream);

 private:
  int64_t capacity_ = 0;
  DeviceArray<uint32_t> keys_in_, keys_out_, idx_in_, idx_cand_, idx_out_, hist_;
  DeviceArray<uint8_t> flags_;
  DeviceArray<int64_t> selected_;
  DeviceArray<unsigned char> temp_;
  std::vector<uint32_t> host_hist_;
};

// PowerSGD products through cuBLAS (fp32, the handle's math mode; REQUIRES rows, cols <= INT_MAX),
// row-major:
// m: (rows, cols), qt: (rank, cols) = Q^T, p: (rows, rank).
// P = M Q.
void powersgd_project(float* p, const float* m, const float* qt, int64_t rows, int64_t cols,
                      int rank, cublasHandle_t handle, cudaStream_t stream);
// Q^T = P^T M (overwrites qt).
void powersgd_back(float* qt, const float* m, const float* p, int64_t rows, int64_t cols, int rank,
                   cublasHandle_t handle, cudaStream_t stream);
// dst[i, j] += weight * sum_c p[i, c] qt[c, j], summed over c in order and rounded per operation
// as compress::internal::powersgd_decode_add_scalar (bit for bit); a kernel, not cuBLAS, so that
// a GPU receiver adds exactly what a CPU receiver adds.
void powersgd_decode_add(float* dst, const float* p, const float* qt, int64_t rows, int64_t cols,
                         int rank, float weight, cudaStream_t stream);

}  // namespace starling::cuda
