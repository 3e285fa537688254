// The Gaussian diffusion of DDPM (Ho et al. 2020): linear and cosine noise schedules, the
// forward process q(x_t | x_0), the epsilon-prediction loss, and two samplers over a
// (possibly respaced) subsequence of the steps: ancestral DDPM and DDIM (Song et al. 2021).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/tensor/tensor.h"
#include "core/util/rng.h"
#include "core/util/status.h"

namespace starling::models {

enum class NoiseSchedule : uint8_t { kLinear, kCosine };
enum class DdpmSampler : uint8_t { kAncestral, kDdim };

struct ScheduleConfig {
  int64_t timesteps = 1000;  // T
  NoiseSchedule schedule = NoiseSchedule::kLinear;
  double beta_start = 1e-4;  // linear
  double beta_end = 0.02;    // linear
  double cosine_s = 0.008;   // cosine
  Status validate() const;   // errors name the [ddpm] key
};

// betas and alpha_bar(t) = prod_{s <= t} (1 - beta_s) for t = 0 .. T-1, in float64.
class Schedule {
 public:
  explicit Schedule(const ScheduleConfig& c);
  int64_t timesteps() const { return static_cast<int64_t>(betas_.size()); }
  double beta(int64_t t) const { return betas_[static_cast<size_t>(t)]; }
  double alpha_bar(int64_t t) const { return alpha_bar_[static_cast<size_t>(t)]; }

  // x_t = sqrt(alpha_bar_t) x0 + sqrt(1 - alpha_bar_t) noise, per image. x0, noise:
  // (B, C, H, W) f32; t: B step indices in [0, T). No autograd history.
  Tensor q_sample(const Tensor& x0, const Tensor& noise, const std::vector<int64_t>& t) const;

  // The subsequence of `steps` steps a sampler visits, increasing, from 0 to T-1 evenly
  // spaced (rounded). REQUIRES: 1 <= steps <= T; steps == 1 gives {T-1}.
  std::vector<int64_t> respaced(int64_t steps) const;

 private:
  std::vector<double> betas_, alpha_bar_;
};

// The denoiser: (x_t (B, C, H, W), t (B) as f32 step indices) -> predicted noise, same shape.
using EpsModel = std::function<Tensor(const Tensor& xt, const Tensor& t)>;

struct SamplerConfig {
  DdpmSampler sampler = DdpmSampler::kDdim;
  int64_t steps = 100;  // network evaluations; REQUIRES 1 <= steps <= T
  double eta = 0.0;     // DDIM only: 0 deterministic, 1 the DDPM posterior's variance
  bool clip_denoised = true;
};

// Draws `num` images of shape (C, H, W) from N(0, I) at step T-1 down to step 0 with `model`
// (called without autograd history), noise from `rng`. Returns (num, C, H, W) f32, clamped to
// [-1, 1]. `on_step`, when set, is called after each step with the steps done.
Tensor sample_images(const EpsModel& model, const Schedule& schedule, const SamplerConfig& sc,
                     int64_t num, int64_t channels, int64_t height, int64_t width, Rng& rng,
                     const std::function<void(int64_t)>& on_step = nullptr);

}  // namespace starling::models
