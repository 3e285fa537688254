// The CUDA DeviceBackend of core/tensor (CUDA builds), and its refusal in CPU-only builds.
#include "core/cuda/tensor_backend.h"

#include <string>

#include "core/tensor/device_backend.h"
#include "core/tensor/tensor.h"

#if defined(STARLING_WITH_CUDA)
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <vector>

#include "core/cuda/device_ops_cuda.h"
#include "core/cuda/image_kernels.h"
#include "core/ops/device_ops.h"

namespace starling::cuda {
namespace {

Status cuda_status(cudaError_t e, const std::string& what) {
  return internal_error(what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

Status launch_status(const std::string& what) {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? ok_status() : cuda_status(e, what);
}

// Makes `device` current for the scope and restores the caller's device.
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) {
    cudaGetDevice(&prev_);
    if (prev_ != device) cudaSetDevice(device);
  }
  ~CurrentDevice() { cudaSetDevice(prev_); }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int prev_ = 0;
};

// Blocks come from one caching allocator per GPU; memsets and copies are blocking calls on the
// legacy default stream, so a tensor's bytes are in place when zeros_on / to() return.
class CudaTensorBackend final : public DeviceBackend {
 public:
  explicit CudaTensorBackend(int count) {
    for (int i = 0; i < count; ++i) allocators_.push_back(std::make_unique<DeviceAllocator>(i));
  }
  const char* name() const override { return "cuda"; }
  int device_count() const override { return static_cast<int>(allocators_.size()); }

  Result<void*> allocate(int index, size_t nbytes) override {
    ASSIGN_OR_RETURN(void* p, allocators_[static_cast<size_t>(index)]->allocate(nbytes));
    CurrentDevice on(index);
    const cudaError_t e = cudaMemset(p, 0, nbytes);
    if (e != cudaSuccess) {
      allocators_[static_cast<size_t>(index)]->deallocate(p);
      return cuda_status(e, "cudaMemset of " + std::to_string(nbytes) + " bytes");
    }
    return p;
  }

  Result<void*> allocate_uninitialized(int index, size_t nbytes) override {
    return allocators_[static_cast<size_t>(index)]->allocate(nbytes);
  }

  void release(int index, void* p, size_t) override {
    allocators_[static_cast<size_t>(index)]->deallocate(p);
  }

  Status copy(void* dst, const void* src, size_t nbytes, Direction direction, int index) override {
    const cudaMemcpyKind kind = direction == Direction::kHostToDevice   ? cudaMemcpyHostToDevice
                                : direction == Direction::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                                        : cudaMemcpyDeviceToDevice;
    CurrentDevice on(index);
    const cudaError_t e = cudaMemcpy(dst, src, nbytes, kind);
    if (e != cudaSuccess)
      return cuda_status(e, "cudaMemcpy of " + std::to_string(nbytes) + " bytes");
    return ok_status();
  }

  // Kernels on the legacy default stream, ordered with the blocking copies above.
  Status gather(void* dst, const void* src, int dims, const int64_t* sizes, const int64_t* strides,
                size_t elem_bytes, int index) override {
    if (dims > 8) return unimplemented("strided gather of more than 8 dimensions");
    CurrentDevice on(index);
    strided_copy(dst, src, dims, sizes, strides, elem_bytes, nullptr);
    return launch_status("strided gather");
  }

  Status accumulate_f32(float* dst, const float* src, size_t n, int index) override {
    CurrentDevice on(index);
    accumulate(dst, src, n, nullptr);
    return launch_status("gradient accumulation");
  }

  AllocatorStats stats(int index) const {
    if (index < 0 || index >= device_count()) return {};
    return allocators_[static_cast<size_t>(index)]->stats();
  }

 private:
  std::vector<std::unique_ptr<DeviceAllocator>> allocators_;
};

std::once_flag g_once;
CudaTensorBackend* g_backend = nullptr;  // lives as long as the process: tensors may outlive main

}  // namespace

Status install_tensor_backend() {
  std::call_once(g_once, [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // no driver: leave the backend out
      return;
    }
    if (n == 0) return;
    g_backend = new CudaTensorBackend(n);
    install_device_backend(DeviceType::kCUDA, g_backend);
    // The ops' device forms (conv2d, group norm, ...) for tensors on these GPUs.
    ops::install_device_ops(DeviceType::kCUDA, cuda_device_ops());
  });
  if (g_backend == nullptr) {
    return failed_precondition("CUDA tensors: no CUDA device visible to this process");
  }
  return ok_status();
}

AllocatorStats tensor_allocator_stats(int device) {
  return g_backend ? g_backend->stats(device) : AllocatorStats{};
}

}  // namespace starling::cuda

#else

namespace starling::cuda {

Status install_tensor_backend() {
  return failed_precondition(
      "CUDA tensors: this starling was built without CUDA (configure with --preset cuda)");
}

AllocatorStats tensor_allocator_stats(int) { return {}; }

}  // namespace starling::cuda

#endif
