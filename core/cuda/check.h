// STARLING_CUDA_CHECK / STARLING_CUBLAS_CHECK: a failed launch or a sticky device fault is a bug
// or a dead GPU, never an input error, so it aborts with the call, file and line.
// (Out-of-memory is the exception: the allocator returns it as a Status.) CUDA builds only.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace starling::cuda::internal {
[[noreturn]] inline void check_failed(const char* expr, const char* what, const char* file,
                                      int line) {
  std::fprintf(stderr, "%s:%d: CUDA check failed: %s: %s\n", file, line, expr, what);
  std::abort();
}
}  // namespace starling::cuda::internal

#define STARLING_CUDA_CHECK(expr)                                                          \
  do {                                                                                     \
    const cudaError_t starling_cuda_e = (expr);                                            \
    if (starling_cuda_e != cudaSuccess) {                                                  \
      ::starling::cuda::internal::check_failed(#expr, cudaGetErrorString(starling_cuda_e), \
                                               __FILE__, __LINE__);                        \
    }                                                                                      \
  } while (0)

// After a <<<...>>> launch: reports bad configurations now, faults at the next sync.
#define STARLING_CUDA_CHECK_LAUNCH() STARLING_CUDA_CHECK(cudaGetLastError())

#define STARLING_CUBLAS_CHECK(expr)                                                             \
  do {                                                                                          \
    const cublasStatus_t starling_cublas_s = (expr);                                            \
    if (starling_cublas_s != CUBLAS_STATUS_SUCCESS) {                                           \
      ::starling::cuda::internal::check_failed(#expr, cublasGetStatusString(starling_cublas_s), \
                                               __FILE__, __LINE__);                             \
    }                                                                                           \
  } while (0)
