// What CUDA devices this process can use. Safe to call in a CPU-only build (reports none).
#pragma once

#include <string>
#include <vector>

namespace starling::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  size_t total_memory = 0;
  int compute_major = 0;
  int compute_minor = 0;
};

// True when starling was built with the CUDA backend.
bool built_with_cuda();
// Devices visible now; empty in a CPU build or when no GPU or driver is present.
std::vector<DeviceInfo> devices();

}  // namespace starling::cuda
