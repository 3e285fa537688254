// Column sums over many rows that fill the chip when there are few columns: grid.y splits the
// rows into slices, each slice writes its partial row, and column_partials_sum adds the slices in
// slice order (deterministic: no atomics).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

namespace starling::cuda::internal {

struct RowSlices {
  int slices = 1;
  int rows_per_slice = 0;
};

// About kTargetBlocks blocks of 32 columns in all (a few waves of 132 SMs), each slice at least
// kMinRows rows so the final pass stays small next to the first.
inline RowSlices row_slices(int rows, int cols) {
  constexpr int kTargetBlocks = 528, kMinRows = 64;
  const int col_blocks = std::max(1, (cols + 31) / 32);
  const int want = std::max(1, kTargetBlocks / col_blocks);
  const int most = std::max(1, (rows + kMinRows - 1) / kMinRows);
  RowSlices s;
  s.slices = std::min(want, most);
  s.rows_per_slice = (rows + s.slices - 1) / s.slices;
  s.slices = (rows + s.rows_per_slice - 1) / s.rows_per_slice;  // no empty slice
  return s;
}

// A stream-ordered buffer of n floats for the partial rows (cudaMallocAsync from the device's
// default pool, which keeps freed memory instead of returning it at every synchronization);
// give it back with cudaFreeAsync on the same stream.
float* partials_alloc(size_t n, cudaStream_t stream);

// out[j] = sum over s in [0, slices) of part[s * cols + j], in s order (matmul_cuda.cu).
void column_partials_sum(float* out, const float* part, int slices, int cols, cudaStream_t stream);

}  // namespace starling::cuda::internal
