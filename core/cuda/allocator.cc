// DeviceAllocator: size-class free lists over cudaMalloc (CUDA builds only; empty otherwise).
#if defined(STARLING_WITH_CUDA)
#include "core/cuda/allocator.h"

#include <cuda_runtime.h>

#include <bit>
#include <string>

#include "core/cuda/check.h"

namespace starling::cuda {

namespace {
// Switches to `device` for the scope and back, so callers' current device is untouched.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    STARLING_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) STARLING_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() { cudaSetDevice(prev_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
};
}  // namespace

DeviceAllocator::DeviceAllocator(int device) : device_(device) {}

DeviceAllocator::~DeviceAllocator() {
  std::lock_guard lk(mu_);
  release_cached_locked();
}

size_t DeviceAllocator::size_class(size_t nbytes) {
  constexpr size_t kSmall = 512, kLarge = size_t{1} << 20;
  if (nbytes <= kLarge) return (nbytes + kSmall - 1) / kSmall * kSmall;
  const size_t step = std::bit_floor(nbytes) / 4;
  return (nbytes + step - 1) / step * step;
}

Result<void*> DeviceAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) return static_cast<void*>(nullptr);
  const size_t cls = size_class(nbytes);
  std::lock_guard lk(mu_);
  void* p = nullptr;
  if (auto it = free_.find(cls); it != free_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    stats_.cached -= cls;
  } else {
    DeviceGuard g(device_);
    cudaError_t e = cudaMalloc(&p, cls);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky: clear it and retry with the cache given back
      release_cached_locked();
      e = cudaMalloc(&p, cls);
    }
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return resource_exhausted("cuda: out of memory allocating " + std::to_string(nbytes) +
                                " bytes on device " + std::to_string(device_) + " (" +
                                std::to_string(stats_.in_use) + " bytes in use)");
    }
    STARLING_CUDA_CHECK(e);
    ++stats_.driver_allocs;
  }
  live_.emplace(p, cls);
  stats_.in_use += cls;
  if (stats_.in_use > stats_.peak_in_use) stats_.peak_in_use = stats_.in_use;
  return p;
}

void DeviceAllocator::deallocate(void* p) {
  if (p == nullptr) return;
  std::lock_guard lk(mu_);
  auto it = live_.find(p);
  if (it == live_.end()) {
    internal::check_failed("deallocate", "pointer not from this allocator", __FILE__, __LINE__);
  }
  const size_t cls = it->second;
  live_.erase(it);
  free_[cls].push_back(p);
  stats_.in_use -= cls;
  stats_.cached += cls;
}

void DeviceAllocator::release_cached() {
  std::lock_guard lk(mu_);
  release_cached_locked();
}

void DeviceAllocator::release_cached_locked() {
  if (free_.empty()) return;
  DeviceGuard g(device_);
  for (auto& [cls, blocks] : free_) {
    for (void* p : blocks) STARLING_CUDA_CHECK(cudaFree(p));
  }
  free_.clear();
  stats_.cached = 0;
}

AllocatorStats DeviceAllocator::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

}  // namespace starling::cuda
#endif
