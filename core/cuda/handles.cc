// Constructors of the RAII handles in handles.h (CUDA builds only; empty otherwise).
#if defined(STARLING_WITH_CUDA)
#include "core/cuda/handles.h"

namespace starling::cuda {

Stream make_stream() {
  cudaStream_t s = nullptr;
  STARLING_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return Stream(s);
}

Event make_event() {
  cudaEvent_t e = nullptr;
  STARLING_CUDA_CHECK(cudaEventCreate(&e));
  return Event(e);
}

CublasHandle make_cublas() {
  cublasHandle_t h = nullptr;
  STARLING_CUBLAS_CHECK(cublasCreate(&h));
  STARLING_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH));
  return CublasHandle(h);
}

CublasLtHandle make_cublas_lt() {
  cublasLtHandle_t h = nullptr;
  STARLING_CUBLAS_CHECK(cublasLtCreate(&h));
  return CublasLtHandle(h);
}

}  // namespace starling::cuda
#endif
