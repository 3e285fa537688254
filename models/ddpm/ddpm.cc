// DdpmConfig from [ddpm], the epsilon-prediction loss, EMA and the checkpoint state layout.
#include "models/ddpm/ddpm.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/autograd/autograd.h"
#include "core/ops/device_ops.h"
#include "core/ops/ops.h"
#include "core/wire/config.pb.h"

namespace starling::models {

DdpmConfig DdpmConfig::from_proto(const v1::RunConfig& c) {
  const auto& d = c.ddpm();
  DdpmConfig out;
  out.unet.image_size = d.image_size();
  out.unet.in_channels = d.image_channels();
  out.unet.base_channels = d.base_channels();
  if (d.channel_mult_size() > 0) {
    out.unet.channel_mult.assign(d.channel_mult().begin(), d.channel_mult().end());
  }
  out.unet.num_res_blocks = d.num_res_blocks();
  out.unet.groups = d.groups();
  out.unet.attention = d.attention();
  out.unet.attention_heads = d.attention_heads();
  out.unet.dropout = d.dropout();
  out.schedule.timesteps = d.timesteps();
  out.schedule.schedule =
      d.schedule() == v1::DdpmConfig::COSINE ? NoiseSchedule::kCosine : NoiseSchedule::kLinear;
  out.schedule.beta_start = d.beta_start();
  out.schedule.beta_end = d.beta_end();
  out.schedule.cosine_s = d.cosine_s();
  out.sampler.sampler =
      d.sampler() == v1::DdpmConfig::ANCESTRAL ? DdpmSampler::kAncestral : DdpmSampler::kDdim;
  out.sampler.steps = d.sampling_steps() > 0 ? d.sampling_steps() : d.timesteps();
  out.sampler.eta = d.ddim_eta();
  out.sampler.clip_denoised = d.clip_denoised();
  out.ema_decay = d.ema_decay();
  out.num_samples = d.num_samples();
  return out;
}

Status DdpmConfig::validate() const {
  RETURN_IF_ERROR(unet.validate());
  RETURN_IF_ERROR(schedule.validate());
  if (sampler.steps < 1 || sampler.steps > schedule.timesteps) {
    return invalid_argument(
        "key 'ddpm.sampling_steps' = " + std::to_string(sampler.steps) +
        " must be in [1, ddpm.timesteps = " + std::to_string(schedule.timesteps) + "]");
  }
  if (!(sampler.eta >= 0.0 && sampler.eta <= 1.0)) {
    return invalid_argument("key 'ddpm.ddim_eta' = " + std::to_string(sampler.eta) +
                            " must be in [0, 1]");
  }
  if (!(ema_decay >= 0.0 && ema_decay < 1.0)) {
    return invalid_argument("key 'ddpm.ema_decay' = " + std::to_string(ema_decay) +
                            " must be in [0, 1)");
  }
  if (num_samples < 1) {
    return invalid_argument("key 'ddpm.num_samples' = " + std::to_string(num_samples) +
                            " must be > 0");
  }
  return ok_status();
}

Ddpm::Ddpm(const DdpmConfig& c, uint64_t seed)
    : config_(c), schedule_(c.schedule), net_(std::make_unique<UNet>(c.unet, seed)) {
  if (c.ema_decay > 0.0) {
    ema_ = std::make_unique<UNet>(c.unet, seed);
    for (const Tensor& p : ema_->parameters()) p.impl()->requires_grad = false;
  }
}

namespace {
Tensor on(const Tensor& t, Device d) {
  if (t.device() == d) return t;
  auto moved = t.to(d);
  if (!moved.ok()) {
    std::fprintf(stderr, "starling: ddpm: a batch to %s: %s\n", device_str(d).c_str(),
                 moved.status().to_string().c_str());
    std::abort();
  }
  return *moved;
}
}  // namespace

Status Ddpm::to(Device device) {
  RETURN_IF_ERROR(net_->to(device));
  if (ema_) RETURN_IF_ERROR(ema_->to(device), "ema");
  device_ = device;
  return ok_status();
}

Tensor Ddpm::loss(const Tensor& x0, const std::vector<int64_t>& t, const Tensor& noise) const {
  // x_t is formed on the host (where batches are drawn), then moves with the noise.
  const Tensor xt = schedule_.q_sample(x0, noise, t);
  std::vector<float> tf(t.begin(), t.end());
  const Tensor tt = Tensor::from_vector(tf, {static_cast<int64_t>(t.size())});
  return ops::mean(
      ops::square(ops::sub(net_->forward(on(xt, device_), on(tt, device_)), on(noise, device_))));
}

Tensor Ddpm::loss(const Tensor& x0, Rng& rng) const {
  const int64_t b = x0.size(0);
  std::vector<int64_t> t(static_cast<size_t>(b));
  for (auto& v : t)
    v = static_cast<int64_t>(rng.below(static_cast<uint64_t>(schedule_.timesteps())));
  const Tensor noise = Tensor::randn(x0.shape(), rng);
  return loss(x0, t, noise);
}

void Ddpm::update_ema(int64_t step) {
  if (!ema_) return;
  const double d =
      std::min(config_.ema_decay, static_cast<double>(1 + step) / static_cast<double>(10 + step));
  const auto src = net_->parameters();
  const auto dst = ema_->parameters();
  const auto df = static_cast<float>(d);
  if (!device_.is_cpu()) {  // the same f32 arithmetic, in place on the device
    auto& table = ops::internal::device_ops_for("ddpm ema", {&dst.front()});
    for (size_t i = 0; i < src.size(); ++i) table.ema_update(dst[i], src[i], df);
    return;
  }
  for (size_t i = 0; i < src.size(); ++i) {
    const float* ps = src[i].data<float>();
    float* pd = dst[i].data<float>();
    const int64_t n = src[i].numel();
    for (int64_t j = 0; j < n; ++j) pd[j] = df * pd[j] + (1.0f - df) * ps[j];
  }
}

Tensor Ddpm::sample(int64_t num, Rng& rng, const SamplerConfig* sc,
                    const std::function<void(int64_t)>& on_step) {
  UNet& m = ema_ ? *ema_ : *net_;
  const bool was_training = m.training();
  m.train(false);
  const UNetConfig& u = config_.unet;
  const Device dev = device_;
  // The sampler's arithmetic runs on the host; each step's network call on the model's device.
  Tensor out = sample_images(
      [&m, dev](const Tensor& x, const Tensor& t) {
        return on(m.forward(on(x, dev), on(t, dev)), Device::cpu());
      },
      schedule_, sc ? *sc : config_.sampler, num, u.in_channels, u.image_size, u.image_size, rng,
      on_step);
  m.train(was_training);
  return out;
}

io::StateDict Ddpm::checkpoint_state() const {
  io::StateDict sd = net_->state_dict();
  if (ema_) {
    for (auto& [name, t] : ema_->state_dict()) sd.emplace_back("ema." + name, t);
  }
  if (!device_.is_cpu()) {
    for (auto& [name, t] : sd) t = on(t, Device::cpu());
  }
  return sd;
}

Status Ddpm::load_checkpoint_state(const io::StateDict& sd) {
  if (!device_.is_cpu()) {
    return failed_precondition("load a DDPM checkpoint before moving the model to " +
                               device_str(device_));
  }
  io::StateDict main, ema;
  for (const auto& [name, t] : sd) {
    if (name.rfind("ema.", 0) == 0) {
      ema.emplace_back(name.substr(4), t);
    } else {
      main.emplace_back(name, t);
    }
  }
  RETURN_IF_ERROR(net_->load_state_dict(main, true));
  if (ema_) {
    if (ema.empty()) return invalid_argument("weights have no 'ema.' copy but ddpm.ema_decay > 0");
    RETURN_IF_ERROR(ema_->load_state_dict(ema, true), "ema");
  } else if (!ema.empty()) {
    return invalid_argument("weights hold an 'ema.' copy but ddpm.ema_decay = 0");
  }
  return ok_status();
}

}  // namespace starling::models
