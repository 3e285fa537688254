// The image models' training steps on a device against the CPU: a U-Net (AdamW, gradient
// clipping that scales, dropout) and a CNN classifier (SGD with Nesterov momentum), each built
// twice from one seed, one moved to `device`, both fed the same batches. rel = 0 asks for
// bit-identical parameters and losses (the emulated device); the CUDA test asks for 1e-3 after
// 10 steps (the bar for fp32). Parameters, gradients and optimizer state must stay on the
// device throughout.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/autograd/autograd.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/elementwise.h"
#include "core/ops/reduce.h"
#include "core/optim/optimizer.h"
#include "models/ddpm/unet.h"
#include "models/mlp/cnn.h"
#include "tests/testing/device_parity.h"

namespace starling::testing {

inline void require_same_parameters(const nn::Module& cpu, const nn::Module& dev, Device device,
                                    double rel) {
  const auto pc = cpu.named_parameters(), pd = dev.named_parameters();
  REQUIRE(pc.size() == pd.size());
  for (size_t i = 0; i < pc.size(); ++i) {
    INFO(pc[i].first);
    CHECK(pc[i].second.is_cpu());
    CHECK(pd[i].second.device() == device);
    const auto a = pc[i].second.to_float_vector(), b = pd[i].second.to_float_vector();
    if (rel == 0) {
      CHECK(a == b);
    } else {
      const double e = device_error(a, b);
      INFO("relative error " << e);
      CHECK(e <= rel);
    }
  }
}

inline void check_close(double a, double b, double rel) {
  if (rel == 0) {
    CHECK(a == b);
  } else {
    CHECK(std::fabs(a - b) <= rel * std::max(1.0, std::fabs(a)));
  }
}

inline void unet_steps_on(Device device, int steps, double rel) {
  models::UNetConfig c;
  c.image_size = 8;
  c.base_channels = 8;
  c.channel_mult = {1, 2};
  c.groups = 4;
  c.attention = true;
  c.dropout = 0.1;
  REQUIRE(c.validate().ok());
  models::UNet cpu(c, 11), dev(c, 11);
  REQUIRE(dev.to(device).ok());
  optim::AdamW opt_c(optim::decay_matrices_only(cpu.parameters()), {0.9, 0.99, 1e-8, 0.01});
  optim::AdamW opt_d(optim::decay_matrices_only(dev.parameters()), {0.9, 0.99, 1e-8, 0.01});
  Rng rng(3);
  for (int step = 0; step < steps; ++step) {
    INFO("step " << step);
    const Tensor x = Tensor::randn({3, 1, 8, 8}, rng);
    const Tensor noise = Tensor::randn({3, 1, 8, 8}, rng);
    const Tensor t = Tensor::from_vector(std::vector<float>{1, 50, 999}, {3});
    const Tensor loss_c = ops::mean(ops::square(ops::sub(cpu.forward(x, t), noise)));
    const Tensor loss_d = ops::mean(
        ops::square(ops::sub(dev.forward(*x.to(device), *t.to(device)), *noise.to(device))));
    REQUIRE(loss_d.device() == device);
    check_close(loss_c.item(), loss_d.item(), rel);
    autograd::backward(loss_c);
    autograd::backward(loss_d);
    for (const Tensor& p : dev.parameters()) {
      REQUIRE(p.grad().defined());
      CHECK(p.grad().device() == device);
    }
    // A small max norm so that the clip scales.
    const double nc = optim::clip_grad_norm(cpu.parameters(), 0.05);
    const double nd = optim::clip_grad_norm(dev.parameters(), 0.05);
    CHECK(std::fabs(nc - nd) <= std::max(rel, 1e-12) * nc);
    opt_c.step(1e-3);
    opt_d.step(1e-3);
    opt_c.zero_grad();
    opt_d.zero_grad();
  }
  require_same_parameters(cpu, dev, device, rel);
}

inline void cnn_steps_on(Device device, int steps, double rel) {
  models::CnnConfig c{12, 3, 4, 16, 5};
  models::Cnn cpu(c, 5), dev(c, 5);
  REQUIRE(dev.to(device).ok());
  optim::Sgd opt_c(optim::decay_matrices_only(cpu.parameters()), {0.9, 1e-4, true});
  optim::Sgd opt_d(optim::decay_matrices_only(dev.parameters()), {0.9, 1e-4, true});
  Rng rng(4);
  for (int step = 0; step < steps; ++step) {
    INFO("step " << step);
    const Tensor x = Tensor::randn({6, 144}, rng);
    const Tensor y = Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 3, 4, 1}, {6});
    const Tensor lc = ops::cross_entropy(cpu.forward(x), y);
    const Tensor ld = ops::cross_entropy(dev.forward(*x.to(device)), *y.to(device));
    check_close(lc.item(), ld.item(), rel);
    autograd::backward(lc);
    autograd::backward(ld);
    opt_c.step(0.05);
    opt_d.step(0.05);
    opt_c.zero_grad();
    opt_d.zero_grad();
  }
  require_same_parameters(cpu, dev, device, rel);
}

}  // namespace starling::testing
