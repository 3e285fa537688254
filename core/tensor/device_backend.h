// Memory of a non-CPU device as Tensor sees it: allocation and blocking copies. core/cuda
// provides the CUDA one (cuda::install_tensor_backend(), over its caching allocator); tests
// register their own to exercise device tensors on machines without a GPU. Tensors on a device
// hold a Storage from here; CPU kernels refuse them (Tensor::data() aborts naming the device).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/util/status.h"

namespace starling {

enum class DeviceType : uint8_t;

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual const char* name() const = 0;  // "cuda"
  // Devices of this type present now (indices 0 .. count - 1).
  virtual int device_count() const = 0;
  // nbytes (> 0) of zeroed memory on device `index`. ResourceExhausted when the device is full.
  virtual Result<void*> allocate(int index, size_t nbytes) = 0;
  // REQUIRES: p came from allocate(index, nbytes) and was not released.
  virtual void release(int index, void* p, size_t nbytes) = 0;
  enum class Direction { kHostToDevice, kDeviceToHost, kDeviceToDevice };
  // Returns when the bytes have arrived.
  virtual Status copy(void* dst, const void* src, size_t nbytes, Direction direction,
                      int index) = 0;

  // nbytes (> 0) of device memory left as it comes (for a writer that overwrites every byte);
  // the default zeroes it (allocate()).
  virtual Result<void*> allocate_uninitialized(int index, size_t nbytes);

  // Optional fast paths; the defaults answer Unimplemented and Tensor then goes through host
  // memory (correct, slower).
  // Lays out a strided view of device memory contiguously at dst (both on device `index`):
  // `dims` sizes and strides (in elements of elem_bytes), src the view's first element.
  virtual Status gather(void* dst, const void* src, int dims, const int64_t* sizes,
                        const int64_t* strides, size_t elem_bytes, int index);
  // dst[i] += src[i] for n floats of device `index` (autograd's gradient accumulation).
  virtual Status accumulate_f32(float* dst, const float* src, size_t n, int index);
};

// The backend of `type` (nullptr for kCPU and for a type nobody installed). Installing replaces
// the previous one and returns it; nullptr uninstalls. The backend must outlive every tensor
// allocated from it.
DeviceBackend* device_backend(DeviceType type);
DeviceBackend* install_device_backend(DeviceType type, DeviceBackend* backend);

}  // namespace starling
