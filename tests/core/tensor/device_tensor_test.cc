// Tensors on a device: Storage from the device's backend, copies both ways (contiguous and
// strided views), device-to-device clones, errors that name the device, memory given back, and
// host access refused. A fake backend (host memory behind the DeviceBackend interface, counting
// every byte and copy) stands in for a GPU; tests/cuda/tensor_backend_test.cc runs the same
// round trips on the real CUDA backend.

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>

#include "core/tensor/device_backend.h"
#include "core/tensor/tensor.h"
#include "core/util/rng.h"
#include "tests/testing/child_process.h"

namespace starling {
namespace {

using Catch::Contains;

class FakeBackend final : public DeviceBackend {
 public:
  const char* name() const override { return "fake"; }
  int device_count() const override { return 2; }
  Result<void*> allocate(int index, size_t nbytes) override {
    if (live_bytes + nbytes > capacity) {
      return resource_exhausted("out of memory: " + std::to_string(nbytes) + " bytes asked");
    }
    void* p = std::calloc(1, nbytes);
    blocks[p] = {index, nbytes};
    live_bytes += nbytes;
    return p;
  }
  void release(int index, void* p, size_t nbytes) override {
    auto it = blocks.find(p);
    REQUIRE(it != blocks.end());
    CHECK(it->second.first == index);
    CHECK(it->second.second == nbytes);
    live_bytes -= nbytes;
    blocks.erase(it);
    std::free(p);
  }
  Status copy(void* dst, const void* src, size_t nbytes, Direction direction, int) override {
    ++copies[direction];
    // Device pointers must be blocks of this backend (or inside one).
    auto on_device = [&](const void* p) {
      const auto at = reinterpret_cast<uintptr_t>(p);
      for (const auto& [b, info] : blocks) {
        const auto start = reinterpret_cast<uintptr_t>(b);
        if (at >= start && at + nbytes <= start + info.second) return true;
      }
      return false;
    };
    const bool src_dev = direction != Direction::kHostToDevice;
    const bool dst_dev = direction != Direction::kDeviceToHost;
    CHECK(on_device(src) == src_dev);
    CHECK(on_device(dst) == dst_dev);
    std::memcpy(dst, src, nbytes);
    return ok_status();
  }

  std::map<void*, std::pair<int, size_t>> blocks;
  std::map<Direction, int> copies;
  size_t live_bytes = 0;
  size_t capacity = size_t{1} << 20;
};

// Installs a fake backend for DeviceType::kCUDA for the scope, restoring the previous one.
struct WithFake {
  WithFake() { previous = install_device_backend(DeviceType::kCUDA, &fake); }
  ~WithFake() { install_device_backend(DeviceType::kCUDA, previous); }
  FakeBackend fake;
  DeviceBackend* previous = nullptr;
};

Tensor counting(const Shape& shape) {
  Tensor t = Tensor::empty(shape);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(i) * 0.5f - 3.0f;
  return t;
}

TEST_CASE("without a backend, device tensors are refused with the device named", "[tensor]") {
  DeviceBackend* previous = install_device_backend(DeviceType::kCUDA, nullptr);
  auto t = Tensor::zeros_on({2, 3}, DType::kF32, Device::cuda(0));
  REQUIRE_FALSE(t.ok());
  CHECK_THAT(t.status().message(), Contains("cuda:0") && Contains("no backend"));
  auto moved = counting({4}).to(Device::cuda(1));
  REQUIRE_FALSE(moved.ok());
  CHECK_THAT(moved.status().message(), Contains("cuda:1"));
  install_device_backend(DeviceType::kCUDA, previous);
}

TEST_CASE("tensors go to a device and back with their values", "[tensor]") {
  WithFake with;
  const Tensor a = counting({3, 5});
  auto d = a.to(Device::cuda(1));
  REQUIRE(d.ok());
  CHECK_FALSE(d->is_cpu());
  CHECK(d->device() == Device::cuda(1));
  CHECK(d->shape() == a.shape());
  CHECK(with.fake.live_bytes == 15 * sizeof(float));
  CHECK(with.fake.blocks.begin()->second.first == 1);  // on device 1
  // Reading values copies to the host.
  CHECK(d->to_float_vector() == a.to_float_vector());
  CHECK(d->select(0, 1).select(0, 2).item() == a.select(0, 1).select(0, 2).item());
  auto back = d->to(Device::cpu());
  REQUIRE(back.ok());
  CHECK(back->is_cpu());
  CHECK(max_abs_diff(*back, a) == 0.0);
  // Same device: the same tensor, no copy.
  const int copies = with.fake.copies[DeviceBackend::Direction::kHostToDevice];
  auto same = d->to(Device::cuda(1));
  REQUIRE(same.ok());
  CHECK(same->shares_storage(*d));
  CHECK(with.fake.copies[DeviceBackend::Direction::kHostToDevice] == copies);
  CHECK_THAT(d->to_string(), Contains("cuda:1"));
}

TEST_CASE("strided views cross devices with their own layout", "[tensor]") {
  WithFake with;
  const Tensor a = counting({4, 6});
  // A transposed host view goes over contiguously.
  auto dt = a.transpose(0, 1).to(Device::cuda(0));
  REQUIRE(dt.ok());
  CHECK(dt->is_contiguous());
  CHECK(dt->to_float_vector() == a.transpose(0, 1).contiguous().to_float_vector());
  // Views of a device tensor: metadata only on the device, values right on the way back.
  auto d = a.to(Device::cuda(0));
  REQUIRE(d.ok());
  const Tensor view = d->slice(1, 1, 5, 2).transpose(0, 1);
  CHECK(view.device() == Device::cuda(0));
  CHECK(view.to_float_vector() == a.slice(1, 1, 5, 2).transpose(0, 1).to_float_vector());
  const Tensor row = d->select(0, 2);  // contiguous, offset into the storage
  CHECK(row.to_float_vector() == a.select(0, 2).to_float_vector());
  CHECK(d->select(0, 3).select(0, 4).item() == a.select(0, 3).select(0, 4).item());
}

TEST_CASE("clones on a device stay there, contiguous ones copy device to device", "[tensor]") {
  WithFake with;
  const Tensor a = counting({2, 3, 4});
  auto d = a.to(Device::cuda(0));
  REQUIRE(d.ok());
  const Tensor c = d->clone();
  CHECK(c.device() == Device::cuda(0));
  CHECK_FALSE(c.shares_storage(*d));
  CHECK(with.fake.copies[DeviceBackend::Direction::kDeviceToDevice] == 1);
  CHECK(c.to_float_vector() == a.to_float_vector());
  const Tensor p = d->permute({2, 0, 1}).contiguous();
  CHECK(p.device() == Device::cuda(0));
  CHECK(p.is_contiguous());
  CHECK(p.to_float_vector() == a.permute({2, 0, 1}).contiguous().to_float_vector());
  auto z = Tensor::zeros_on({0}, DType::kF64, Device::cuda(0));  // empty: no bytes, no copies
  REQUIRE(z.ok());
  CHECK(z->clone().numel() == 0);
}

TEST_CASE("device memory goes back when the last tensor dies, errors name the device", "[tensor]") {
  WithFake with;
  {
    auto d = Tensor::zeros_on({100}, DType::kF64, Device::cuda(0));
    REQUIRE(d.ok());
    CHECK(d->to_double_vector() == std::vector<double>(100, 0.0));
    const Tensor view = d->slice(0, 10, 20);
    d = Tensor::zeros_on({1}, DType::kF32, Device::cuda(0));  // the first storage lives on
    CHECK(with.fake.live_bytes == 100 * sizeof(double) + sizeof(float));
  }
  CHECK(with.fake.live_bytes == 0);
  CHECK(with.fake.blocks.empty());

  with.fake.capacity = 64;
  auto big = Tensor::zeros_on({1000}, DType::kF32, Device::cuda(1));
  REQUIRE_FALSE(big.ok());
  CHECK(big.status().code() == StatusCode::kResourceExhausted);
  CHECK_THAT(big.status().message(), Contains("cuda:1") && Contains("out of memory"));
  auto missing = Tensor::zeros_on({1}, DType::kF32, Device::cuda(2));
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(missing.status().message(), Contains("cuda:2") && Contains("2 present"));
}

TEST_CASE("host access to a device tensor aborts with the reason", "[tensor]") {
  WithFake with;
  auto d = counting({3}).to(Device::cuda(0));
  REQUIRE(d.ok());
  CHECK(d->device_data<float>() != nullptr);  // the device's own address is available
  // A CPU kernel reaching for the data.
  const auto [err, aborted] = testing::run_expecting_abort([&] {
    volatile float x = d->data<float>()[0];
    (void)x;
  });
  CHECK(aborted);
  CHECK_THAT(err, Contains("cuda:0") && Contains("to(Device::cpu())"));
}

}  // namespace
}  // namespace starling
