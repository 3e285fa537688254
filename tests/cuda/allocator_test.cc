// [cuda] DeviceAllocator: size classes, reuse from the free lists, and out-of-memory as a
// Status rather than an abort.
#include "core/cuda/allocator.h"

#include <catch2/catch.hpp>

#include "tests/cuda/cuda_testing.h"

namespace starling::cuda {
namespace {

TEST_CASE("size classes pad by at most 25% above 1 MiB") {
  REQUIRE(DeviceAllocator::size_class(1) == 512);
  REQUIRE(DeviceAllocator::size_class(513) == 1024);
  REQUIRE(DeviceAllocator::size_class(1 << 20) == (1 << 20));
  const size_t big = (size_t{1} << 24) + 1;
  const size_t cls = DeviceAllocator::size_class(big);
  REQUIRE(cls >= big);
  REQUIRE(cls <= big + big / 4);
}

TEST_CASE("freed blocks are reused without going back to the driver", "[cuda]") {
  STARLING_REQUIRE_GPU();
  DeviceAllocator alloc(0);
  auto a = alloc.allocate(1000);
  REQUIRE(a.ok());
  REQUIRE(alloc.stats().in_use == 1024);
  alloc.deallocate(*a);
  REQUIRE(alloc.stats().cached == 1024);
  auto b = alloc.allocate(900);  // same class
  REQUIRE(b.ok());
  REQUIRE(*b == *a);
  REQUIRE(alloc.stats().driver_allocs == 1);
  STARLING_CUDA_CHECK(cudaMemset(*b, 0, 900));
  STARLING_CUDA_CHECK(cudaDeviceSynchronize());
  alloc.deallocate(*b);
  alloc.release_cached();
  REQUIRE(alloc.stats().cached == 0);
  REQUIRE(alloc.stats().peak_in_use == 1024);
}

TEST_CASE("out of memory is ResourceExhausted, and the device stays usable", "[cuda]") {
  STARLING_REQUIRE_GPU();
  DeviceAllocator alloc(0);
  auto huge = alloc.allocate(size_t{1} << 50);
  REQUIRE_FALSE(huge.ok());
  REQUIRE(huge.status().code() == StatusCode::kResourceExhausted);
  auto small = alloc.allocate(4096);
  REQUIRE(small.ok());
  alloc.deallocate(*small);
}

}  // namespace
}  // namespace starling::cuda
