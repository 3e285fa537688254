// The image diffusion model: a U-Net epsilon predictor, its noise schedule and samplers, and an
// exponential moving average (EMA) of the weights that sampling uses.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/io/state_dict.h"
#include "core/util/rng.h"
#include "core/util/status.h"
#include "models/ddpm/diffusion.h"
#include "models/ddpm/unet.h"

namespace starling::v1 {
class RunConfig;
}

namespace starling::models {

struct DdpmConfig {
  UNetConfig unet;
  ScheduleConfig schedule;
  SamplerConfig sampler;
  double ema_decay = 0.999;  // 0: no EMA
  int64_t num_samples = 64;

  // From [ddpm] (an empty channel_mult gives [1, 2, 2]; sampling_steps 0 gives timesteps).
  static DdpmConfig from_proto(const v1::RunConfig& c);
  // Every part valid and 1 <= sampler.steps <= timesteps; errors name the [ddpm] key.
  Status validate() const;
};

class Ddpm {
 public:
  // Weights from Rng(seed). REQUIRES: c.validate().ok().
  Ddpm(const DdpmConfig& c, uint64_t seed);
  const DdpmConfig& config() const { return config_; }
  UNet& net() { return *net_; }
  const UNet& net() const { return *net_; }
  const Schedule& schedule() const { return schedule_; }
  bool has_ema() const { return ema_ != nullptr; }
  // Moves the network and its EMA copy to `device` (a GPU through the ops' device forms). Batches
  // stay on the host: loss() moves x_t, the steps and the noise there, sample() each step's
  // input; checkpoint_state() hands back host copies. Errors name the parameter and the device.
  Status to(Device device);
  Device device() const { return device_; }

  // Mean squared error between `noise` and the network's prediction at x_t = q_sample(x0, t,
  // noise): the simplified DDPM objective. x0, noise: (B, C, H, W) f32 in the model's space
  // ([-1, 1] images); t: B steps in [0, T). Differentiable in the network's weights.
  Tensor loss(const Tensor& x0, const std::vector<int64_t>& t, const Tensor& noise) const;
  // Draws t uniformly from [0, T) and noise from N(0, I) with `rng`, then loss(x0, t, noise).
  Tensor loss(const Tensor& x0, Rng& rng) const;

  // ema = d ema + (1 - d) weights with d = min(ema_decay, (1 + step) / (10 + step)).
  // No-op without EMA.
  void update_ema(int64_t step);

  // `num` images (num, C, H, W) in [-1, 1] from the EMA weights (else the trained ones), in
  // eval mode, with `sc` (default: the config's sampler).
  Tensor sample(int64_t num, Rng& rng, const SamplerConfig* sc = nullptr,
                const std::function<void(int64_t)>& on_step = nullptr);

  // The weights a checkpoint holds: the network's names, then the EMA copy under "ema.".
  io::StateDict checkpoint_state() const;
  // Loads checkpoint_state()'s layout (strict; the "ema." part required iff EMA is on).
  Status load_checkpoint_state(const io::StateDict& sd);

 private:
  DdpmConfig config_;
  Schedule schedule_;
  std::unique_ptr<UNet> net_;
  std::unique_ptr<UNet> ema_;
  Device device_;
};

}  // namespace starling::models
