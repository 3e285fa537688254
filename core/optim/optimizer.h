// Optimizers over a module's parameters: SGD (momentum, weight decay) and AdamW (decoupled
// weight decay), gradient clipping by global norm, and the warmup + cosine schedule.
// Parameters are f32 (or f64); state lives beside them in the same dtype.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/ops/device_ops.h"
#include "core/tensor/tensor.h"

namespace starling::optim {

// One parameter and whether weight decay applies to it (nanoGPT: only tensors with dim >= 2).
struct ParamGroup {
  Tensor param;
  bool decay = true;
};

// Groups every parameter, decaying matrices and embeddings but not biases and norms.
std::vector<ParamGroup> decay_matrices_only(const std::vector<Tensor>& params);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Applies one update with learning rate `lr` from each parameter's grad(). Parameters with no
  // gradient are skipped. Runs without recording autograd history.
  virtual void step(double lr) = 0;
  void zero_grad();
  // Number of step() calls so far.
  int64_t steps() const { return steps_; }

 protected:
  explicit Optimizer(std::vector<ParamGroup> params) : params_(std::move(params)) {}
  std::vector<ParamGroup> params_;
  int64_t steps_ = 0;
};

struct SgdOptions {
  double momentum = 0.0;
  double weight_decay = 0.0;  // coupled (added to the gradient), as torch.optim.SGD
  bool nesterov = false;
};

class Sgd final : public Optimizer {
 public:
  Sgd(std::vector<ParamGroup> params, SgdOptions opt);
  void step(double lr) override;

 private:
  SgdOptions opt_;
  std::vector<Tensor> velocity_;
};

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  // decoupled: p -= lr * wd * p
};

class AdamW final : public Optimizer {
 public:
  AdamW(std::vector<ParamGroup> params, AdamWOptions opt);
  void step(double lr) override;

 private:
  AdamWOptions opt_;
  std::vector<Tensor> m_, v_;
};

// The federated client's local step (FedAvg's SGD with FedProx's proximal term): each float32
// parameter p -= lr (grad + mu (p - anchor)), where `anchor` is the flat model the parameters
// started the round from, in parameter order (read only when mu > 0). Parameters with no
// gradient are skipped but keep their place in `anchor`. Large parameters are split over the
// OpenMP threads.
void sgd_prox_step(const std::vector<Tensor>& params, float lr, float mu, const float* anchor);

// Scales all gradients so that their global L2 norm is at most max_norm; returns the norm
// before clipping. max_norm <= 0 only measures.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

// Linear warmup to `lr` over warmup_iters, cosine decay to min_lr at decay_iters, then min_lr
// (nanoGPT's get_lr).
struct CosineSchedule {
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup_iters = 100;
  int64_t decay_iters = 2000;
  double at(int64_t it) const;
};

namespace internal {
// The f32 update loops of AdamW::step and Sgd::step on one parameter's host memory (devices
// that step through the host, such as the tests' emulated device, call the same arithmetic).
void adamw_update_f32(float* p, const float* g, float* m, float* v, int64_t n,
                      const ops::DeviceAdamW& a);
void sgd_update_f32(float* p, const float* g, float* velocity, int64_t n, const ops::DeviceSgd& s);
// clip_grad_norm's sum of squares of one f32 gradient, in double.
double sum_squares_f32(const float* g, int64_t n);
}  // namespace internal

}  // namespace starling::optim
