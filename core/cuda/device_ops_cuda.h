// The CUDA table of the ops' device forms (core/ops/device_ops.h): cuDNN convolutions
// (conv_cudnn.h), cuBLAS linears, the flash attention kernels and the image kernels
// (image_kernels.h), all on the legacy default stream of the tensor's GPU, so that they are
// ordered with the tensor backend's blocking copies. cuda::install_tensor_backend() installs it.
// CUDA builds only.
#pragma once

#include "core/ops/device_ops.h"

namespace starling::cuda {

// The process's table (made on first use; lives as long as the process).
ops::DeviceOps* cuda_device_ops();

}  // namespace starling::cuda
