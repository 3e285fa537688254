// The image models train on a device through the ops' device forms: a U-Net and a CNN moved to
// the emulated device (tests/testing/emulated_device.h) take the same AdamW / SGD steps, with
// gradient clipping, as their CPU twins, and end with bit-identical parameters; parameters,
// gradients and optimizer state stay on the device throughout.
#include <catch2/catch.hpp>
#include <vector>

#include "core/autograd/autograd.h"
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
#include "core/optim/optimizer.h"
#include "models/ddpm/unet.h"
#include "models/mlp/cnn.h"
#include "tests/testing/emulated_device.h"

namespace starling {
namespace {

Tensor on(const Tensor& t, Device d) { return *t.to(d); }

void require_same_parameters(const nn::Module& a, const nn::Module& b) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].first);
    CHECK(pa[i].second.is_cpu());
    CHECK(pb[i].second.device() == testing::EmulatedDevice::device());
    CHECK(pa[i].second.to_float_vector() == pb[i].second.to_float_vector());
  }
}

TEST_CASE("a U-Net trains on the device exactly as on the CPU", "[models][device]") {
  testing::EmulatedDevice device;
  const Device dev = testing::EmulatedDevice::device();
  models::UNetConfig c;
  c.image_size = 8;
  c.base_channels = 8;
  c.channel_mult = {1, 2};
  c.groups = 4;
  c.attention = true;
  c.dropout = 0.1;
  REQUIRE(c.validate().ok());
  models::UNet cpu(c, 11), gpu(c, 11);
  REQUIRE(gpu.to(dev).ok());
  optim::AdamW opt_c(optim::decay_matrices_only(cpu.parameters()), {0.9, 0.99, 1e-8, 0.01});
  optim::AdamW opt_g(optim::decay_matrices_only(gpu.parameters()), {0.9, 0.99, 1e-8, 0.01});
  Rng rng(3);
  for (int step = 0; step < 3; ++step) {
    const Tensor x = Tensor::randn({3, 1, 8, 8}, rng);
    const Tensor noise = Tensor::randn({3, 1, 8, 8}, rng);
    const Tensor t = Tensor::from_vector(std::vector<float>{1, 50, 999}, {3});
    const Tensor loss_c = ops::mean(ops::square(ops::sub(cpu.forward(x, t), noise)));
    const Tensor loss_g =
        ops::mean(ops::square(ops::sub(gpu.forward(on(x, dev), on(t, dev)), on(noise, dev))));
    REQUIRE(loss_g.device() == dev);
    CHECK(loss_c.item() == loss_g.item());
    autograd::backward(loss_c);
    autograd::backward(loss_g);
    for (const Tensor& p : gpu.parameters()) {
      REQUIRE(p.grad().defined());
      CHECK(p.grad().device() == dev);
    }
    // A small max norm so that the clip scales (both sides the same way).
    const double nc = optim::clip_grad_norm(cpu.parameters(), 0.05);
    const double ng = optim::clip_grad_norm(gpu.parameters(), 0.05);
    CHECK(nc == Approx(ng).epsilon(1e-12));
    opt_c.step(1e-3);
    opt_g.step(1e-3);
    opt_c.zero_grad();
    opt_g.zero_grad();
  }
  require_same_parameters(cpu, gpu);
}

TEST_CASE("a CNN classifier trains on the device exactly as on the CPU", "[models][device]") {
  testing::EmulatedDevice device;
  const Device dev = testing::EmulatedDevice::device();
  models::CnnConfig c{12, 3, 4, 16, 5};
  models::Cnn cpu(c, 5), gpu(c, 5);
  REQUIRE(gpu.to(dev).ok());
  optim::Sgd opt_c(optim::decay_matrices_only(cpu.parameters()), {0.9, 1e-4, true});
  optim::Sgd opt_g(optim::decay_matrices_only(gpu.parameters()), {0.9, 1e-4, true});
  Rng rng(4);
  for (int step = 0; step < 3; ++step) {
    const Tensor x = Tensor::randn({6, 144}, rng);
    const Tensor y = Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 3, 4, 1}, {6});
    const Tensor lc = ops::cross_entropy(cpu.forward(x), y);
    const Tensor lg = ops::cross_entropy(gpu.forward(on(x, dev)), on(y, dev));
    CHECK(lc.item() == lg.item());
    autograd::backward(lc);
    autograd::backward(lg);
    opt_c.step(0.05);
    opt_g.step(0.05);
    opt_c.zero_grad();
    opt_g.zero_grad();
  }
  require_same_parameters(cpu, gpu);
}

}  // namespace
}  // namespace starling
