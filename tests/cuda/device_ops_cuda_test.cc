// The ops' CUDA forms (core/cuda/device_ops_cuda.cc: cuDNN convolutions, group norms, pooling,
// upsampling, attention, cross-entropy, ...) against their CPU forms, forward and backward, fp32
// within 1e-5 relative (the same cases the emulated device passes bit for bit); then 10 training
// steps of a U-Net (AdamW, clipping, dropout) and of a CNN (SGD) within 1e-3 of the CPU; and a
// federated DDPM client's round on the GPU (edge_client::DdpmTrainer) against the CPU's.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <vector>

#include "core/cuda/tensor_backend.h"
#include "edge_client/ddpm_trainer.h"
#include "edge_client/mnist_trainer.h"
#include "edge_client/model_params.h"
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

TEST_CASE("a DDPM client round on the GPU sends the CPU round's delta within 1e-4", "[cuda]") {
  STARLING_REQUIRE_GPU();
  auto images = std::make_shared<data::MnistSet>();
  images->rows = images->cols = 8;
  Rng rng(9);
  for (int i = 0; i < 12 * 64; ++i) images->images.push_back(static_cast<float>(rng.uniform()));
  for (int i = 0; i < 12; ++i) images->labels.push_back(i % 10);
  std::vector<int64_t> all(12);
  for (int i = 0; i < 12; ++i) all[static_cast<size_t>(i)] = i;
  edge_client::DdpmTrainerOptions o;
  o.model.unet.image_size = 8;
  o.model.unet.base_channels = 8;
  o.model.unet.channel_mult = {1, 2};
  o.model.unet.groups = 4;
  o.model.unet.attention = true;
  o.model.schedule.timesteps = 50;
  o.model.sampler.steps = 10;
  o.model.ema_decay = 0.0;
  o.steps.optimizer = edge_client::LocalStepOptions::Optimizer::kAdamW;
  const auto global = edge_client::flatten(models::Ddpm(o.model, 1).net());
  v1::RoundPlan plan;
  plan.set_round(1);
  plan.set_local_steps(5);
  plan.set_batch_size(4);
  plan.set_learning_rate(1e-3f);
  plan.set_seed(3);
  std::vector<float> cpu_delta(global.size()), gpu_delta(global.size());
  edge_client::DdpmTrainer cpu(images, all, o);
  o.device = Device::cuda(0);
  edge_client::DdpmTrainer gpu(images, all, o);
  auto rc = cpu.train(global, plan, cpu_delta);
  auto rg = gpu.train(global, plan, gpu_delta);
  REQUIRE(rc.ok());
  REQUIRE(rg.ok());
  CHECK(std::fabs(rc->loss - rg->loss) <= 1e-4 * std::max(1.0f, std::fabs(rc->loss)));
  // Normalized over the whole update (AdamW's first steps move every weight by about lr).
  double diff = 0, norm = 0;
  for (size_t i = 0; i < global.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(cpu_delta[i]) - gpu_delta[i]));
    norm = std::max(norm, std::fabs(static_cast<double>(cpu_delta[i])));
  }
  INFO("max |delta difference| " << diff << " of max |delta| " << norm);
  CHECK(diff <= 1e-4 * norm + 1e-7);
}

TEST_CASE("a CNN client round on the GPU (SGD with FedProx) sends the CPU's delta within 1e-4",
          "[cuda]") {
  STARLING_REQUIRE_GPU();
  auto set = std::make_shared<data::MnistSet>();
  set->rows = set->cols = 8;
  Rng rng(5);
  for (int i = 0; i < 40; ++i) {
    for (int p = 0; p < 64; ++p) set->images.push_back(static_cast<float>(rng.uniform()));
    set->labels.push_back(i % 10);
  }
  std::vector<int64_t> all(40);
  for (int i = 0; i < 40; ++i) all[static_cast<size_t>(i)] = i;
  edge_client::MnistTrainerOptions o;
  o.model = edge_client::MnistModel::kCnn;
  o.cnn = models::CnnConfig{0, 4, 8, 16, 10};
  o.prox_mu = 0.1f;
  const auto global = edge_client::flatten(*edge_client::make_mnist_model(o, 64, 7));
  v1::RoundPlan plan;
  plan.set_round(1);
  plan.set_local_steps(8);
  plan.set_batch_size(10);
  plan.set_learning_rate(0.05f);
  plan.set_seed(3);
  std::vector<float> cpu_delta(global.size()), gpu_delta(global.size());
  edge_client::MnistTrainer cpu(set, all, o);
  o.device = Device::cuda(0);
  edge_client::MnistTrainer gpu(set, all, o);
  auto rc = cpu.train(global, plan, cpu_delta);
  auto rg = gpu.train(global, plan, gpu_delta);
  REQUIRE(rc.ok());
  REQUIRE(rg.ok());
  CHECK(std::fabs(rc->loss - rg->loss) <= 1e-4 * std::max(1.0f, std::fabs(rc->loss)));
  CHECK(starling::testing::relative_error(cpu_delta, gpu_delta) <= 1e-4);
}

}  // namespace
}  // namespace starling::cuda
