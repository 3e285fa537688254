// CUDA build of the device query, through the runtime API.
#include <cuda_runtime.h>

#include "core/cuda/device.h"

namespace starling::cuda {

bool built_with_cuda() { return true; }

std::vector<DeviceInfo> devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the "no driver" error; no devices is a valid answer
    return {};
  }
  std::vector<DeviceInfo> out;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out.push_back({i, p.name, p.totalGlobalMem, p.major, p.minor});
  }
  return out;
}

}  // namespace starling::cuda
