// CPU-only build of the device query: no CUDA, no devices.
#include "core/cuda/device.h"

#if !defined(STARLING_WITH_CUDA)
namespace starling::cuda {
bool built_with_cuda() { return false; }
std::vector<DeviceInfo> devices() { return {}; }
}  // namespace starling::cuda
#endif
