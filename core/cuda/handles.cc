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
  // The default math mode: fp32 GEMMs stay IEEE fp32 (no TF32 unless asked for, so the fp32
  // parity tests hold), bf16 GEMMs use the tensor cores. CUBLAS_PEDANTIC_MATH, used before,
  // is cuBLAS's debugging mode and slow on Hopper.
  STARLING_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
  return CublasHandle(h);
}

CublasLtHandle make_cublas_lt() {
  cublasLtHandle_t h = nullptr;
  STARLING_CUBLAS_CHECK(cublasLtCreate(&h));
  return CublasLtHandle(h);
}

}  // namespace starling::cuda
#endif
