// RAII for the CUDA runtime's and cuBLAS's C handles (streams, events, cuBLAS handles), and a
// typed owning device buffer. CUDA builds only.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "core/cuda/check.h"

namespace starling::cuda {

struct StreamDeleter {
  void operator()(cudaStream_t s) const { cudaStreamDestroy(s); }
};
using Stream = std::unique_ptr<CUstream_st, StreamDeleter>;
// A non-blocking stream on the current device.
Stream make_stream();

struct EventDeleter {
  void operator()(cudaEvent_t e) const { cudaEventDestroy(e); }
};
using Event = std::unique_ptr<CUevent_st, EventDeleter>;
Event make_event();

struct CublasDeleter {
  void operator()(cublasHandle_t h) const { cublasDestroy(h); }
};
using CublasHandle = std::unique_ptr<cublasContext, CublasDeleter>;
// A cuBLAS handle on the current device in plain fp32 math (no TF32), so fp32 GEMMs match the
// CPU reference; bf16 paths opt into tensor cores per call.
CublasHandle make_cublas();

struct CublasLtDeleter {
  void operator()(cublasLtHandle_t h) const { cublasLtDestroy(h); }
};
using CublasLtHandle = std::unique_ptr<cublasLtContext, CublasLtDeleter>;
CublasLtHandle make_cublas_lt();

// n elements of T in device memory from cudaMalloc, freed on destruction. Move-only.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n) : n_(n) {
    void* p = nullptr;
    if (n > 0) STARLING_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
    p_.reset(static_cast<T*>(p));
  }
  static DeviceArray from_host(const std::vector<T>& v) {
    DeviceArray a(v.size());
    if (!v.empty()) {
      STARLING_CUDA_CHECK(
          cudaMemcpy(a.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
    return a;
  }
  // Blocking copy back to the host (synchronizes with the legacy default stream).
  std::vector<T> to_host() const {
    std::vector<T> v(n_);
    if (n_ > 0) {
      STARLING_CUDA_CHECK(cudaMemcpy(v.data(), get(), n_ * sizeof(T), cudaMemcpyDeviceToHost));
    }
    return v;
  }
  T* get() const { return p_.get(); }
  size_t size() const { return n_; }

 private:
  struct Free {
    void operator()(T* p) const { cudaFree(p); }
  };
  std::unique_ptr<T, Free> p_;
  size_t n_ = 0;
};

}  // namespace starling::cuda
