// The CUDA DeviceBackend of core/tensor: Tensor::zeros_on(..., Device::cuda(i)) and
// Tensor::to(Device::cuda(i)) allocate through one caching DeviceAllocator per GPU and copy with
// blocking cudaMemcpy. Safe to call in a CPU-only build.
#pragma once

#include "core/cuda/allocator.h"
#include "core/util/status.h"

namespace starling::cuda {

// Installs the CUDA backend for DeviceType::kCUDA once (later calls do nothing). Fails with the
// reason when the build has no CUDA or no GPU is visible.
Status install_tensor_backend();

// Bytes the tensor backend's allocator of `device` holds (in use, cached, peak); zeros before
// install or in a CPU build.
AllocatorStats tensor_allocator_stats(int device);

}  // namespace starling::cuda
