// The device forms of the ops (core/ops/device_ops.h) on the emulated device: every op with a
// device form agrees bit for bit with its CPU form, forward and backward (the routing: inputs,
// outputs and gradients on the device); mixed devices and missing kernels abort naming the op.
// tests/cuda/device_ops_cuda_test.cc runs the same cases on the CUDA kernels.
#include "core/ops/device_ops.h"

#include <catch2/catch.hpp>

#include "core/ops/activation.h"
#include "core/ops/attention.h"
#include "core/ops/concat.h"
#include "core/ops/conv.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/dropout.h"
#include "core/ops/elementwise.h"
#include "core/ops/layer_norm.h"
#include "core/ops/matmul.h"
#include "core/ops/norm2d.h"
#include "core/ops/pool.h"
#include "core/ops/reduce.h"
#include "core/ops/relu.h"
#include "core/ops/time_embedding.h"
#include "tests/testing/child_process.h"
#include "tests/testing/device_op_cases.h"
#include "tests/testing/emulated_device.h"

namespace starling {
namespace {

using Catch::Contains;

TEST_CASE("every op's device form equals its CPU form, forward and backward", "[ops][device]") {
  testing::EmulatedDevice device;
  const size_t before = device.op_calls();
  testing::run_device_op_cases(testing::EmulatedDevice::device(), 0.0);
  // Each case took the device form (forward, and backward through its own node).
  CHECK(device.op_calls() - before >= 26);
}

TEST_CASE("ops on tensors of different devices abort naming the op and both devices",
          "[ops][device]") {
  testing::EmulatedDevice device;
  Rng rng(1);
  const Tensor a = Tensor::randn({2, 3}, rng);
  const Tensor b = *Tensor::randn({2, 3}, rng).to(testing::EmulatedDevice::device());
  auto [err, aborted] = testing::run_expecting_abort([&] { (void)ops::add(a, b); });
  CHECK(aborted);
  CHECK_THAT(err, Contains("add") && Contains("cpu") && Contains("cuda:0"));
}

TEST_CASE("an op without a device form, or a device without kernels, aborts with the reason",
          "[ops][device]") {
  testing::EmulatedDevice device;
  Rng rng(2);
  const Tensor x = *Tensor::randn({2, 4}, rng).to(testing::EmulatedDevice::device());
  {
    const Tensor w = *Tensor::ones({4}).to(testing::EmulatedDevice::device());
    auto [err, aborted] = testing::run_expecting_abort([&] { (void)ops::layer_norm(x, w, w); });
    CHECK(aborted);
    CHECK_THAT(err, Contains("cuda:0"));
  }
  {
    // The backend stays (the memory is reachable) but no kernels are installed.
    auto [err, aborted] = testing::run_expecting_abort([&] {
      ops::install_device_ops(DeviceType::kCUDA, nullptr);
      (void)ops::silu(x);
    });
    CHECK(aborted);
    CHECK_THAT(err, Contains("silu") && Contains("no kernels"));
  }
  {
    auto [err, aborted] = testing::run_expecting_abort([&] {
      (void)ops::add(x, ops::mul_scalar(x, 2.0).view({4, 2}));
    });
    CHECK(aborted);
    CHECK_THAT(err, Contains("one shape"));
  }
}

}  // namespace
}  // namespace starling
