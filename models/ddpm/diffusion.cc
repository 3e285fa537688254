// Schedules in float64; samplers in f32 tensors with per-step coefficients from the schedule.
// A respaced sampler treats the visited steps as a shorter chain whose one-step alpha is
// alpha_bar(t) / alpha_bar(prev) (Nichol & Dhariwal 2021, section 4).
#include "models/ddpm/diffusion.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "core/autograd/autograd.h"

namespace starling::models {

Status ScheduleConfig::validate() const {
  if (timesteps < 1) {
    return invalid_argument("key 'ddpm.timesteps' = " + std::to_string(timesteps) + " must be > 0");
  }
  if (schedule == NoiseSchedule::kLinear &&
      !(beta_start > 0 && beta_start <= beta_end && beta_end < 1)) {
    return invalid_argument("keys 'ddpm.beta_start' = " + std::to_string(beta_start) +
                            " and 'ddpm.beta_end' = " + std::to_string(beta_end) +
                            " must satisfy 0 < beta_start <= beta_end < 1");
  }
  if (schedule == NoiseSchedule::kCosine && !(cosine_s >= 0 && std::isfinite(cosine_s))) {
    return invalid_argument("key 'ddpm.cosine_s' = " + std::to_string(cosine_s) +
                            " must be finite and >= 0");
  }
  return ok_status();
}

Schedule::Schedule(const ScheduleConfig& c) {
  const auto n = static_cast<size_t>(c.timesteps);
  betas_.resize(n);
  if (c.schedule == NoiseSchedule::kLinear) {
    for (size_t i = 0; i < n; ++i) {
      betas_[i] = n == 1 ? c.beta_start
                         : c.beta_start + (c.beta_end - c.beta_start) * static_cast<double>(i) /
                                              static_cast<double>(n - 1);
    }
  } else {
    auto f = [&](double t) {
      const double v = std::cos((t / static_cast<double>(n) + c.cosine_s) / (1.0 + c.cosine_s) *
                                std::numbers::pi / 2.0);
      return v * v;
    };
    for (size_t i = 0; i < n; ++i) {
      betas_[i] = std::min(1.0 - f(static_cast<double>(i + 1)) / f(static_cast<double>(i)), 0.999);
    }
  }
  alpha_bar_.resize(n);
  double prod = 1.0;
  for (size_t i = 0; i < n; ++i) {
    prod *= 1.0 - betas_[i];
    alpha_bar_[i] = prod;
  }
}

Tensor Schedule::q_sample(const Tensor& x0, const Tensor& noise,
                          const std::vector<int64_t>& t) const {
  const Tensor xc = x0.contiguous(), nc = noise.contiguous();
  const int64_t b = x0.size(0), per = x0.numel() / b;
  Tensor out = Tensor::uninitialized(x0.shape(), DType::kF32);
  const float* px = xc.data<float>();
  const float* pn = nc.data<float>();
  float* po = out.data<float>();
  for (int64_t i = 0; i < b; ++i) {
    const double ab = alpha_bar(t[static_cast<size_t>(i)]);
    const auto a = static_cast<float>(std::sqrt(ab)), s = static_cast<float>(std::sqrt(1.0 - ab));
    for (int64_t j = i * per; j < (i + 1) * per; ++j) po[j] = a * px[j] + s * pn[j];
  }
  return out;
}

std::vector<int64_t> Schedule::respaced(int64_t steps) const {
  const int64_t n = timesteps();
  if (steps <= 1) return {n - 1};
  std::vector<int64_t> seq;
  for (int64_t i = 0; i < steps; ++i) {
    const auto v = static_cast<int64_t>(std::llround(
        static_cast<double>(i) * static_cast<double>(n - 1) / static_cast<double>(steps - 1)));
    if (seq.empty() || v > seq.back()) seq.push_back(v);
  }
  return seq;
}

Tensor sample_images(const EpsModel& model, const Schedule& schedule, const SamplerConfig& sc,
                     int64_t num, int64_t channels, int64_t height, int64_t width, Rng& rng,
                     const std::function<void(int64_t)>& on_step) {
  autograd::NoGradGuard ng;
  const Shape shape = {num, channels, height, width};
  Tensor x = Tensor::randn(shape, rng);
  const int64_t n = x.numel();
  const std::vector<int64_t> seq = schedule.respaced(sc.steps);
  std::vector<float> x0(static_cast<size_t>(n)), eps(static_cast<size_t>(n));
  for (auto i = static_cast<int64_t>(seq.size()) - 1; i >= 0; --i) {
    const int64_t t = seq[static_cast<size_t>(i)];
    const double ab = schedule.alpha_bar(t);
    const double ab_prev = i > 0 ? schedule.alpha_bar(seq[static_cast<size_t>(i - 1)]) : 1.0;
    const Tensor tt = Tensor::full({num}, static_cast<double>(t));
    const Tensor e = model(x, tt).contiguous();
    const float* pe = e.data<float>();
    float* px = x.data<float>();
    // Predicted x0 (clipped), and the noise consistent with it.
    const double sa = std::sqrt(ab), s1 = std::sqrt(1.0 - ab);
    for (int64_t j = 0; j < n; ++j) {
      double v = (static_cast<double>(px[j]) - s1 * pe[j]) / sa;
      if (sc.clip_denoised) v = std::clamp(v, -1.0, 1.0);
      x0[static_cast<size_t>(j)] = static_cast<float>(v);
      eps[static_cast<size_t>(j)] = static_cast<float>((px[j] - sa * v) / s1);
    }
    const bool last = i == 0;
    if (sc.sampler == DdpmSampler::kAncestral) {
      // Posterior q(x_prev | x_t, x0) of the (respaced) one-step chain.
      const double beta = 1.0 - ab / ab_prev;
      const double c0 = std::sqrt(ab_prev) * beta / (1.0 - ab);
      const double ct = std::sqrt(1.0 - beta) * (1.0 - ab_prev) / (1.0 - ab);
      const double sigma = last ? 0.0 : std::sqrt(beta * (1.0 - ab_prev) / (1.0 - ab));
      for (int64_t j = 0; j < n; ++j) {
        const double z = last ? 0.0 : rng.normal();
        px[j] = static_cast<float>(c0 * x0[static_cast<size_t>(j)] + ct * px[j] + sigma * z);
      }
    } else {
      const double sigma = sc.eta * std::sqrt((1.0 - ab_prev) / (1.0 - ab)) *
                           std::sqrt(std::max(0.0, 1.0 - ab / ab_prev));
      const double dir = std::sqrt(std::max(0.0, 1.0 - ab_prev - sigma * sigma));
      const double sp = std::sqrt(ab_prev);
      for (int64_t j = 0; j < n; ++j) {
        const double z = sigma > 0 ? rng.normal() : 0.0;
        px[j] = static_cast<float>(sp * x0[static_cast<size_t>(j)] +
                                   dir * eps[static_cast<size_t>(j)] + sigma * z);
      }
    }
    if (on_step) on_step(static_cast<int64_t>(seq.size()) - i);
  }
  float* px = x.data<float>();
  for (int64_t j = 0; j < n; ++j) px[j] = std::clamp(px[j], -1.0f, 1.0f);
  return x;
}

}  // namespace starling::models
