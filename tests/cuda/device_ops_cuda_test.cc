// The ops' CUDA forms (core/cuda/device_ops_cuda.cc: cuDNN convolutions, group norms, pooling,
// upsampling, attention, cross-entropy, ...) against their CPU forms, forward and backward, fp32
// within 1e-5 relative (the same cases the emulated device passes bit for bit); then 10 training
// steps of a U-Net (AdamW, clipping, dropout) and of a CNN (SGD) within 1e-3 of the CPU.
#include <catch2/catch.hpp>

#include "core/cuda/tensor_backend.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/testing/device_model_cases.h"
#include "tests/testing/device_op_cases.h"

namespace starling::cuda {
namespace {

TEST_CASE("every op's CUDA form matches its CPU form, forward and backward", "[cuda]") {
  STARLING_REQUIRE_GPU();
  REQUIRE(install_tensor_backend().ok());
  starling::testing::run_device_op_cases(Device::cuda(0), 1e-5);
}

TEST_CASE("10 U-Net training steps on the GPU match the CPU within 1e-3", "[cuda]") {
  STARLING_REQUIRE_GPU();
  REQUIRE(install_tensor_backend().ok());
  starling::testing::unet_steps_on(Device::cuda(0), 10, 1e-3);
}

TEST_CASE("10 CNN training steps on the GPU match the CPU within 1e-3", "[cuda]") {
  STARLING_REQUIRE_GPU();
  REQUIRE(install_tensor_backend().ok());
  starling::testing::cnn_steps_on(Device::cuda(0), 10, 1e-3);
}

}  // namespace
}  // namespace starling::cuda
