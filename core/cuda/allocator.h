// DeviceAllocator: a caching allocator over cudaMalloc (never managed memory). Freed blocks go
// to a free list per size class and are reused, so a training step allocates nothing from the
// driver after the first. CUDA builds only.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/util/status.h"

namespace starling::cuda {

struct AllocatorStats {
  size_t in_use = 0;       // bytes handed out (rounded to size classes)
  size_t cached = 0;       // bytes held in free lists
  size_t peak_in_use = 0;  // high-water mark of in_use
  size_t driver_allocs = 0;
};

// Owns every block it ever got from cudaMalloc on `device` until release_cached() or
// destruction. Blocks are reused in stream order: a freed block may be handed out again at
// once, which is safe when all users of the allocator work on one stream (or synchronize).
// Thread-safe.
class DeviceAllocator {
 public:
  explicit DeviceAllocator(int device);
  ~DeviceAllocator();  // frees cached blocks; blocks still in use are leaked to the driver
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  // A block of at least nbytes (256-byte aligned). nbytes == 0 gives nullptr. When the driver
  // is out of memory even after the cache is released: ResourceExhausted, never an abort.
  Result<void*> allocate(size_t nbytes);
  // REQUIRES: p came from allocate() of this allocator and was not freed (nullptr is a no-op).
  void deallocate(void* p);
  // Returns every cached (free) block to the driver.
  void release_cached();
  AllocatorStats stats() const;

  // The size class of a request: multiples of 512 B up to 1 MiB, then four classes per power
  // of two (at most 25% padding).
  static size_t size_class(size_t nbytes);

 private:
  void release_cached_locked();

  const int device_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // class -> free blocks
  std::unordered_map<void*, size_t> live_;     // block -> class
  AllocatorStats stats_;
};

}  // namespace starling::cuda
