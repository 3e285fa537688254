// The MDLM and DDPM local trainers: deterministic rounds that move the model, rounds that lower
// the loss (SGD and AdamW), step counts, and bad input.
#include <catch2/catch.hpp>
#include <cmath>

#include "edge_client/ddpm_trainer.h"
#include "edge_client/mdlm_trainer.h"
#include "edge_client/model_params.h"
#include "tests/testing/emulated_device.h"

namespace starling::edge_client {
namespace {

MdlmTrainerOptions tiny_mdlm() {
  MdlmTrainerOptions o;
  o.model.vocab_size = 5;
  o.model.block_size = 8;
  o.model.n_layer = 1;
  o.model.n_head = 2;
  o.model.n_embd = 16;
  return o;
}

DdpmTrainerOptions tiny_ddpm() {
  DdpmTrainerOptions o;
  o.model.unet.image_size = 8;
  o.model.unet.base_channels = 8;
  o.model.unet.channel_mult = {1, 2};
  o.model.unet.groups = 4;
  o.model.unet.attention = false;
  o.model.schedule.timesteps = 50;
  o.model.sampler.steps = 10;
  o.model.ema_decay = 0.0;
  return o;
}

std::shared_ptr<const std::vector<int32_t>> stream(int n) {
  auto v = std::make_shared<std::vector<int32_t>>();
  for (int i = 0; i < n; ++i) v->push_back(i % 5);
  return v;
}

// 12 8x8 images: a bright square at one of four places.
std::shared_ptr<const data::MnistSet> squares() {
  auto s = std::make_shared<data::MnistSet>();
  s->rows = s->cols = 8;
  for (int i = 0; i < 12; ++i) {
    const int r0 = (i % 2) * 4, c0 = ((i / 2) % 2) * 4;
    for (int p = 0; p < 64; ++p) {
      const int r = p / 8, c = p % 8;
      s->images.push_back(r >= r0 && r < r0 + 4 && c >= c0 && c < c0 + 4 ? 1.0f : 0.0f);
    }
    s->labels.push_back(i % 4);
  }
  return s;
}

v1::RoundPlan plan(uint64_t seed, uint32_t steps, float lr) {
  v1::RoundPlan p;
  p.set_round(1);
  p.set_local_steps(steps);
  p.set_batch_size(4);
  p.set_learning_rate(lr);
  p.set_seed(seed);
  return p;
}

std::vector<int64_t> all(int n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

TEST_CASE("an MDLM client round repeats bit for bit and moves the model", "[edge_client]") {
  auto tokens = stream(300);
  MdlmTrainer a(tokens, 10, 200, tiny_mdlm()), b(tokens, 10, 200, tiny_mdlm());
  const auto global = flatten(models::Mdlm(tiny_mdlm().model, 7));
  REQUIRE(a.layout().size() == layout_of(models::Mdlm(tiny_mdlm().model, 7)).size());
  std::vector<float> da(global.size()), db(global.size()), dc(global.size());
  auto ra = a.train(global, plan(3, 2, 0.1f), da);
  auto rb = b.train(global, plan(3, 2, 0.1f), db);
  REQUIRE(ra.ok());
  REQUIRE(rb.ok());
  CHECK(ra->num_samples == 190);
  CHECK(std::isfinite(ra->loss));
  CHECK(da == db);
  REQUIRE(a.train(global, plan(4, 2, 0.1f), dc).ok());
  CHECK(da != dc);  // another seed, other windows and masks
  double norm = 0;
  for (float d : da) norm += static_cast<double>(d) * d;
  CHECK(norm > 0);
}

TEST_CASE("federated rounds of the diffusion trainers lower their loss", "[edge_client]") {
  SECTION("MDLM, AdamW") {
    auto o = tiny_mdlm();
    o.steps.optimizer = LocalStepOptions::Optimizer::kAdamW;
    MdlmTrainer t(stream(9), 0, 9, o);  // one window of 8: learnable from positions alone
    auto global = flatten(models::Mdlm(o.model, 1));
    std::vector<float> delta(global.size());
    auto first = t.train(global, plan(1, 10, 1e-2f), delta);
    REQUIRE(first.ok());
    for (int r = 2; r <= 16; ++r) {
      REQUIRE(t.train(global, plan(static_cast<uint64_t>(r), 10, 1e-2f), delta).ok());
      for (size_t i = 0; i < global.size(); ++i) global[i] += delta[i];
    }
    auto last = t.train(global, plan(1, 10, 1e-2f), delta);
    REQUIRE(last.ok());
    CHECK(last->loss < 0.8f * first->loss);
  }
  SECTION("DDPM, SGD") {
    DdpmTrainer t(squares(), all(12), tiny_ddpm());
    auto global = flatten(models::Ddpm(tiny_ddpm().model, 1).net());
    std::vector<float> delta(global.size());
    auto first = t.train(global, plan(1, 6, 0.05f), delta);
    REQUIRE(first.ok());
    for (int r = 2; r <= 6; ++r) {
      REQUIRE(t.train(global, plan(static_cast<uint64_t>(r), 6, 0.05f), delta).ok());
      for (size_t i = 0; i < global.size(); ++i) global[i] += delta[i];
    }
    auto last = t.train(global, plan(1, 6, 0.05f), delta);
    REQUIRE(last.ok());
    CHECK(last->num_samples == 12);
    CHECK(last->loss < 0.8f * first->loss);
  }
}

TEST_CASE("a DDPM client round on a device equals the CPU round bit for bit",
          "[edge_client][device]") {
  // SGD with FedProx's term, SGD alone and AdamW with clipping: the delta a client sends and its
  // loss are the CPU's, while the model, its gradients and the optimizer state stay on the
  // device (tests/testing/emulated_device.h; tests/cuda runs the same on a GPU).
  for (const float mu : {0.0f, 0.1f}) {
    for (const auto opt :
         {LocalStepOptions::Optimizer::kSgd, LocalStepOptions::Optimizer::kAdamW}) {
      if (opt == LocalStepOptions::Optimizer::kAdamW && mu > 0) continue;
      INFO("prox_mu " << mu << ", AdamW " << (opt == LocalStepOptions::Optimizer::kAdamW));
      DdpmTrainerOptions o = tiny_ddpm();
      o.steps.optimizer = opt;
      o.steps.prox_mu = mu;
      o.steps.grad_clip = 0.05f;
      o.model.unet.attention = true;
      o.model.unet.dropout = 0.1;
      const auto global = flatten(models::Ddpm(o.model, 1).net());
      std::vector<float> cpu_delta(global.size()), dev_delta(global.size());
      DdpmTrainer cpu(squares(), all(12), o);
      testing::EmulatedDevice device;
      o.device = testing::EmulatedDevice::device();
      DdpmTrainer dev(squares(), all(12), o);
      for (int round = 0; round < 2; ++round) {  // the second round reuses the moved model
        INFO("round " << round);
        auto rc = cpu.train(global, plan(3, 4, 0.02f), cpu_delta);
        auto rd = dev.train(global, plan(3, 4, 0.02f), dev_delta);
        REQUIRE(rc.ok());
        REQUIRE(rd.ok());
        CHECK(rd->loss == rc->loss);
        CHECK(dev_delta == cpu_delta);
      }
    }
  }
}

TEST_CASE("a DDPM client asked for a device that is not there fails its rounds with the reason",
          "[edge_client][device]") {
  DdpmTrainerOptions o = tiny_ddpm();
  o.device = Device::cuda(0);
  DdpmTrainer t(squares(), all(12), o);
  const auto global = flatten(models::Ddpm(o.model, 1).net());
  std::vector<float> delta(global.size());
  {
    testing::EmulatedDevice device;  // one device only
    DdpmTrainerOptions o7 = o;
    o7.device = Device::cuda(7);
    DdpmTrainer seven(squares(), all(12), o7);
    auto r = seven.train(global, plan(1, 2, 0.01f), delta);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("cuda:7") && Catch::Contains("not visible"));
  }
#if !defined(STARLING_WITH_CUDA)
  auto r = t.train(global, plan(1, 2, 0.01f), delta);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("client.device") && Catch::Contains("CUDA"));
#endif
}

TEST_CASE("diffusion local steps and bad input", "[edge_client]") {
  v1::RoundPlan p;
  p.set_batch_size(4);
  CHECK(ddpm_local_steps(10, 1, p) == 3);
  CHECK(ddpm_local_steps(10, 2, p) == 6);
  CHECK(ddpm_local_steps(2, 1, p) == 1);
  p.set_local_steps(7);
  CHECK(ddpm_local_steps(10, 1, p) == 7);

  const auto global = flatten(models::Mdlm(tiny_mdlm().model, 1));
  std::vector<float> delta(global.size());
  MdlmTrainer short_client(stream(100), 0, 8, tiny_mdlm());
  auto r = short_client.train(global, plan(1, 1, 0.1f), delta);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kFailedPrecondition);
  MdlmTrainer ok(stream(100), 0, 100, tiny_mdlm());
  std::vector<float> wrong(global.size() - 1);
  CHECK_FALSE(ok.train(global, plan(1, 1, 0.1f), wrong).ok());
  CHECK_FALSE(ok.train(std::span<const float>(global).first(10), plan(1, 1, 0.1f),
                       std::span<float>(delta).first(10))
                  .ok());

  DdpmTrainer none(squares(), {}, tiny_ddpm());
  const auto dglobal = flatten(models::Ddpm(tiny_ddpm().model, 1).net());
  std::vector<float> ddelta(dglobal.size());
  CHECK(none.train(dglobal, plan(1, 1, 0.1f), ddelta).status().code() ==
        StatusCode::kFailedPrecondition);
  DdpmTrainer diverge(squares(), all(12), tiny_ddpm());
  auto d = diverge.train(dglobal, plan(1, 30, 1e30f), ddelta);
  REQUIRE_FALSE(d.ok());
  CHECK(d.status().message().find("diverged") != std::string::npos);
}

TEST_CASE("the federation config gives the diffusion trainers' options", "[edge_client]") {
  v1::FederationConfig c;
  c.mutable_model()->set_arch(v1::FedModelConfig::DDPM);
  c.mutable_model()->set_local_optimizer(v1::FedModelConfig::ADAMW);
  c.mutable_model()->set_adamw_weight_decay(0.01f);
  c.mutable_model()->mutable_ddpm()->set_base_channels(8);
  c.mutable_model()->mutable_ddpm()->add_channel_mult(1);
  c.mutable_model()->mutable_ddpm()->add_channel_mult(2);
  c.mutable_local()->set_epochs(3);
  const auto d = ddpm_trainer_options(c);
  CHECK(d.model.unet.base_channels == 8);
  CHECK(d.model.unet.channel_mult == std::vector<int64_t>{1, 2});
  CHECK(d.model.ema_decay == 0.0);  // raw weights are federated
  CHECK(d.epochs == 3);
  CHECK(d.steps.optimizer == LocalStepOptions::Optimizer::kAdamW);
  CHECK(d.steps.weight_decay == 0.01f);
  CHECK(ddpm_run_config(c).model().arch() == v1::ModelConfig::DDPM);

  c.mutable_model()->set_arch(v1::FedModelConfig::MDLM);
  c.mutable_model()->set_n_embd(32);
  c.mutable_model()->mutable_diffusion()->set_noise(v1::DiffusionConfig::UNIFORM);
  const auto m = mdlm_trainer_options(c, 65);
  CHECK(m.model.vocab_size == 65);
  CHECK(m.model.n_embd == 32);
  CHECK(m.model.noise == models::DiffusionNoise::kUniform);
  CHECK_FALSE(mdlm_run_config(c, 65).model().causal());
}

}  // namespace
}  // namespace starling::edge_client
