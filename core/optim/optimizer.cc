// Fused per-parameter update loops (one pass over p, g and the state), OpenMP-parallel.
#include "core/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/autograd/autograd.h"
#include "core/ops/device_ops.h"

namespace starling::optim {

namespace {
template <typename F>
void for_float(const Tensor& t, F&& f) {
  if (t.dtype() == DType::kF32) {
    f.template operator()<float>();
  } else {
    f.template operator()<double>();
  }
}

// The update loops, one definition for the CPU optimizers and for devices that step through the
// host (internal::adamw_update_f32, sgd_update_f32).
template <typename T>
void sgd_loop(T* pp, const T* pg, T* pv, int64_t n, const ops::DeviceSgd& s) {
  const T mom = static_cast<T>(s.momentum), tlr = static_cast<T>(s.lr),
          twd = static_cast<T>(s.weight_decay);
  const bool first = s.first_step, nesterov = s.nesterov;
#pragma omp parallel for simd if (n > (1 << 15))
  for (int64_t j = 0; j < n; ++j) {
    T d = pg[j] + twd * pp[j];
    if (mom != T(0)) {
      pv[j] = first ? d : mom * pv[j] + d;
      d = nesterov ? d + mom * pv[j] : pv[j];
    }
    pp[j] -= tlr * d;
  }
}

template <typename T>
void adamw_loop(T* pp, const T* pg, T* pm, T* pv, int64_t n, const ops::DeviceAdamW& a) {
  const double bc1 = 1.0 - std::pow(a.beta1, static_cast<double>(a.step));
  const double bc2 = 1.0 - std::pow(a.beta2, static_cast<double>(a.step));
  const T b1 = static_cast<T>(a.beta1), b2 = static_cast<T>(a.beta2);
  const T step_size = static_cast<T>(a.lr / bc1);
  const T inv_sqrt_bc2 = static_cast<T>(1.0 / std::sqrt(bc2));
  const T eps = static_cast<T>(a.eps);
  const T decay = static_cast<T>(1.0 - a.lr * a.weight_decay);
#pragma omp parallel for simd if (n > (1 << 15))
  for (int64_t j = 0; j < n; ++j) {
    const T g = pg[j];
    pm[j] = b1 * pm[j] + (1 - b1) * g;
    pv[j] = b2 * pv[j] + (1 - b2) * g * g;
    const T denom = std::sqrt(pv[j]) * inv_sqrt_bc2 + eps;
    pp[j] = pp[j] * decay - step_size * pm[j] / denom;
  }
}

template <typename T>
double sum_squares_loop(const T* pg, int64_t n) {
  double s = 0.0;
#pragma omp parallel for simd reduction(+ : s) if (n > (1 << 15))
  for (int64_t j = 0; j < n; ++j) s += static_cast<double>(pg[j]) * pg[j];
  return s;
}

// Optimizer state lives where its parameter lives: moved once, on the first step after the
// parameter moved (a model sent to a GPU after its optimizer was made).
void follow(Tensor& state, const Tensor& param) {
  if (state.device() == param.device()) return;
  auto moved = state.to(param.device());
  if (!moved.ok()) {
    std::fprintf(stderr, "starling: optimizer state to %s: %s\n",
                 device_str(param.device()).c_str(), moved.status().to_string().c_str());
    std::abort();
  }
  state = *moved;
}
}  // namespace

namespace internal {
void adamw_update_f32(float* p, const float* g, float* m, float* v, int64_t n,
                      const ops::DeviceAdamW& a) {
  adamw_loop<float>(p, g, m, v, n, a);
}
void sgd_update_f32(float* p, const float* g, float* velocity, int64_t n, const ops::DeviceSgd& s) {
  sgd_loop<float>(p, g, velocity, n, s);
}
double sum_squares_f32(const float* g, int64_t n) { return sum_squares_loop<float>(g, n); }
}  // namespace internal

std::vector<ParamGroup> decay_matrices_only(const std::vector<Tensor>& params) {
  std::vector<ParamGroup> out;
  for (const auto& p : params) out.push_back({p, p.dim() >= 2});
  return out;
}

void Optimizer::zero_grad() {
  for (auto& g : params_) g.param.impl()->grad = nullptr;
}

Sgd::Sgd(std::vector<ParamGroup> params, SgdOptions opt) : Optimizer(std::move(params)), opt_(opt) {
  for (auto& g : params_) velocity_.push_back(Tensor::zeros(g.param.shape(), g.param.dtype()));
}

void Sgd::step(double lr) {
  autograd::NoGradGuard ng;
  ++steps_;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor p = params_[i].param;
    const Tensor grad = p.grad();
    if (!grad.defined()) continue;
    const double wd = params_[i].decay ? opt_.weight_decay : 0.0;
    const bool first = steps_ == 1;
    if (!p.is_cpu()) {
      follow(velocity_[i], p);
      ops::internal::device_ops_for("Sgd", {&p, &grad})
          .sgd_step(p, grad, velocity_[i],
                    ops::DeviceSgd{lr, opt_.momentum, wd, opt_.nesterov, first});
      continue;
    }
    for_float(p, [&]<typename T>() {
      sgd_loop<T>(p.data<T>(), grad.data<T>(), velocity_[i].data<T>(), p.numel(),
                  ops::DeviceSgd{lr, opt_.momentum, wd, opt_.nesterov, first});
    });
  }
}

AdamW::AdamW(std::vector<ParamGroup> params, AdamWOptions opt)
    : Optimizer(std::move(params)), opt_(opt) {
  for (auto& g : params_) {
    m_.push_back(Tensor::zeros(g.param.shape(), g.param.dtype()));
    v_.push_back(Tensor::zeros(g.param.shape(), g.param.dtype()));
  }
}

void AdamW::step(double lr) {
  autograd::NoGradGuard ng;
  ++steps_;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor p = params_[i].param;
    const Tensor grad = p.grad();
    if (!grad.defined()) continue;
    const double wd = params_[i].decay ? opt_.weight_decay : 0.0;
    if (!p.is_cpu()) {
      follow(m_[i], p);
      follow(v_[i], p);
      ops::internal::device_ops_for("AdamW", {&p, &grad})
          .adamw_step(p, grad, m_[i], v_[i],
                      ops::DeviceAdamW{lr, opt_.beta1, opt_.beta2, opt_.eps, wd, steps_});
      continue;
    }
    for_float(p, [&]<typename T>() {
      adamw_loop<T>(p.data<T>(), grad.data<T>(), m_[i].data<T>(), v_[i].data<T>(), p.numel(),
                    ops::DeviceAdamW{lr, opt_.beta1, opt_.beta2, opt_.eps, wd, steps_});
    });
  }
}

namespace {

// w -= lr (g + mu (w - w0)) over [0, n).
inline void sgd_prox_range(float* w, const float* g, const float* w0, float lr, float mu,
                           int64_t n) {
  if (mu > 0) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) w[i] -= lr * (g[i] + mu * (w[i] - w0[i]));
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) w[i] -= lr * g[i];
  }
}

}  // namespace

void sgd_prox_step(const std::vector<Tensor>& params, float lr, float mu, const float* anchor) {
  autograd::NoGradGuard no_grad;
  // Below this many elements a parameter is updated on the calling thread: waking the team
  // costs more than the pass.
  constexpr int64_t kParallel = int64_t{1} << 18;
  constexpr int64_t kChunk = int64_t{1} << 16;
  size_t offset = 0;
  for (const auto& p : params) {
    const int64_t numel = p.numel();
    const Tensor g = p.grad();
    if (g.defined()) {
      float* w = p.data<float>();
      const float* gd = g.data<float>();
      const float* w0 = mu > 0 ? anchor + offset : nullptr;
      if (numel < kParallel) {
        sgd_prox_range(w, gd, w0, lr, mu, numel);
      } else {
        const int64_t chunks = (numel + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
        for (int64_t c = 0; c < chunks; ++c) {
          const int64_t lo = c * kChunk, n = std::min(kChunk, numel - lo);
          sgd_prox_range(w + lo, gd + lo, w0 ? w0 + lo : nullptr, lr, mu, n);
        }
      }
    }
    offset += static_cast<size_t>(numel);
  }
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  double sq = 0.0;
  std::vector<Tensor> on_device;  // summed on their device with one wait, after the host's
  for (const auto& p : params) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    if (!g.is_cpu()) {
      on_device.push_back(g);
      continue;
    }
    for_float(g, [&]<typename T>() { sq += sum_squares_loop<T>(g.data<T>(), g.numel()); });
  }
  if (!on_device.empty()) {
    const Tensor& first = on_device.front();
    sq += ops::internal::device_ops_for("clip_grad_norm", {&first}).sum_squares(on_device);
  }
  const double norm = std::sqrt(sq);
  if (max_norm > 0.0 && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    for (const auto& p : params) {
      Tensor g = p.grad();
      if (!g.defined()) continue;
      if (!g.is_cpu()) {
        ops::internal::device_ops_for("clip_grad_norm", {&g}).scale_(g, scale);
        continue;
      }
      for_float(g, [&]<typename T>() {
        T* pg = g.data<T>();
        const T s = static_cast<T>(scale);
        const int64_t n = g.numel();
        for (int64_t j = 0; j < n; ++j) pg[j] *= s;
      });
    }
  }
  return norm;
}

double CosineSchedule::at(int64_t it) const {
  if (it < warmup_iters)
    return lr * static_cast<double>(it + 1) / static_cast<double>(warmup_iters + 1);
  if (it > decay_iters) return min_lr;
  const double ratio = static_cast<double>(it - warmup_iters) /
                       static_cast<double>(std::max<int64_t>(decay_iters - warmup_iters, 1));
  const double coeff = 0.5 * (1.0 + std::cos(M_PI * ratio));
  return min_lr + coeff * (lr - min_lr);
}

}  // namespace starling::optim
