// The CUDA DeviceBackend of core/tensor on a real GPU: tensors to cuda:0 and back, strided
// views, device-to-device clones, memory through the caching allocator, out-of-memory as a
// Status. Without a GPU, installing the backend fails with the reason and the rest is skipped.
#include "core/cuda/tensor_backend.h"

#include <catch2/catch.hpp>

#include "core/tensor/tensor.h"
#include "tests/cuda/cuda_testing.h"

namespace starling::cuda {
namespace {

using Catch::Contains;

TEST_CASE("CUDA tensors round-trip through the tensor backend", "[cuda]") {
  const Status installed = install_tensor_backend();
  if (devices().empty()) {
    REQUIRE_FALSE(installed.ok());
    CHECK_THAT(installed.message(), Contains("CUDA"));
  }
  STARLING_REQUIRE_GPU();
  REQUIRE(installed.ok());
  const auto values = testing::random_floats(6 * 7 * 5, 11);
  const Tensor a = Tensor::from_vector(values, {6, 7, 5});
  const size_t before = tensor_allocator_stats(0).in_use;
  {
    auto d = a.to(Device::cuda(0));
    REQUIRE(d.ok());
    CHECK(d->device() == Device::cuda(0));
    CHECK(tensor_allocator_stats(0).in_use > before);
    CHECK(d->to_float_vector() == values);
    CHECK(d->permute({2, 0, 1}).to_float_vector() ==
          a.permute({2, 0, 1}).contiguous().to_float_vector());
    CHECK(d->select(0, 4).to_float_vector() == a.select(0, 4).to_float_vector());
    const Tensor c = d->clone();
    CHECK_FALSE(c.shares_storage(*d));
    CHECK(c.to_float_vector() == values);
    auto z = Tensor::zeros_on({1000}, DType::kF64, Device::cuda(0));
    REQUIRE(z.ok());
    CHECK(z->to_double_vector() == std::vector<double>(1000, 0.0));
  }
  CHECK(tensor_allocator_stats(0).in_use == before);  // back in the allocator's cache
  auto huge = Tensor::zeros_on({int64_t{1} << 40}, DType::kF32, Device::cuda(0));  // 4 TiB
  REQUIRE_FALSE(huge.ok());
  CHECK(huge.status().code() == StatusCode::kResourceExhausted);
  CHECK_THAT(huge.status().message(), Contains("cuda:0"));
}

}  // namespace
}  // namespace starling::cuda
