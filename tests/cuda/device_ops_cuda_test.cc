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

// n random side x side images in [0, 1), labelled i % 10.
std::shared_ptr<const data::MnistSet> random_images(int n, int side, uint64_t seed) {
  auto set = std::make_shared<data::MnistSet>();
  set->rows = set->cols = side;
  Rng rng(seed);
  for (int i = 0; i < n * side * side; ++i)
    set->images.push_back(static_cast<float>(rng.uniform()));
  for (int i = 0; i < n; ++i) set->labels.push_back(i % 10);
  return set;
}

v1::RoundPlan round_plan(uint32_t steps, uint32_t batch, float lr) {
  v1::RoundPlan plan;
  plan.set_round(1);
  plan.set_local_steps(steps);
  plan.set_batch_size(batch);
  plan.set_learning_rate(lr);
  plan.set_seed(3);
  return plan;
}

// One round of `Trainer` made from `o` on the CPU and on cuda:0 over every image of `set`: the
// losses within 1e-4 relative, the deltas within 1e-4 of the largest CPU delta (plus 1e-7: AdamW's
// first steps move every weight by about lr).
template <class Trainer, class Options>
void check_gpu_round(std::shared_ptr<const data::MnistSet> set, Options o,
                     const std::vector<float>& global, const v1::RoundPlan& plan) {
  std::vector<int64_t> all(static_cast<size_t>(set->size()));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  std::vector<float> cpu_delta(global.size()), gpu_delta(global.size());
  Trainer cpu(set, all, o);
  o.device = Device::cuda(0);
  Trainer gpu(set, all, o);
  auto rc = cpu.train(global, plan, cpu_delta);
  auto rg = gpu.train(global, plan, gpu_delta);
  REQUIRE(rc.ok());
  REQUIRE(rg.ok());
  CHECK(std::fabs(rc->loss - rg->loss) <= 1e-4 * std::max(1.0f, std::fabs(rc->loss)));
  double norm = 0;
  for (float v : cpu_delta) norm = std::max(norm, std::fabs(static_cast<double>(v)));
  const double diff = starling::testing::device_error(cpu_delta, gpu_delta) * std::max(norm, 1e-30);
  INFO("max |delta difference| " << diff << " of max |delta| " << norm);
  CHECK(diff <= 1e-4 * norm + 1e-7);
}

TEST_CASE("a DDPM client round on the GPU sends the CPU round's delta within 1e-4", "[cuda]") {
  STARLING_REQUIRE_GPU();
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
  check_gpu_round<edge_client::DdpmTrainer>(random_images(12, 8, 9), o, global,
                                            round_plan(5, 4, 1e-3f));
}

TEST_CASE("a CNN client round on the GPU (SGD with FedProx) sends the CPU's delta within 1e-4",
          "[cuda]") {
  STARLING_REQUIRE_GPU();
  edge_client::MnistTrainerOptions o;
  o.model = edge_client::MnistModel::kCnn;
  o.cnn = models::CnnConfig{0, 4, 8, 16, 10};
  o.prox_mu = 0.1f;
  const auto global = edge_client::flatten(*edge_client::make_mnist_model(o, 64, 7));
  check_gpu_round<edge_client::MnistTrainer>(random_images(40, 8, 5), o, global,
                                             round_plan(8, 10, 0.05f));
}

}  // namespace
}  // namespace starling::cuda
