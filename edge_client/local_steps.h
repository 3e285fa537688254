// The local step loop the diffusion trainers share: load the global model, take a number of
// optimizer steps (SGD with FedProx's proximal term, or AdamW with fresh moments) on the losses a
// batch function returns, clip the gradient, and write local - global as the delta.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "core/nn/module.h"
#include "core/optim/optimizer.h"
#include "core/util/rng.h"
#include "core/util/status.h"
#include "core/wire/federation.pb.h"
#include "core/wire/messages.pb.h"

namespace starling::edge_client {

struct LocalStepOptions {
  enum class Optimizer : uint8_t { kSgd, kAdamW };
  Optimizer optimizer = Optimizer::kSgd;
  float prox_mu = 0.0f;       // SGD: gradient += mu (w - w_global)
  float grad_clip = 1.0f;     // global gradient norm clip per step; 0: none
  float beta1 = 0.9f;         // AdamW
  float beta2 = 0.99f;        // AdamW
  float weight_decay = 0.0f;  // AdamW, decoupled, on matrices only
};

// [model] local_optimizer, adamw_* and grad_clip, and [local] prox_mu.
LocalStepOptions local_step_options(const v1::FederationConfig& config);

// Internal error naming the step when a local step's loss is not finite (the round diverged);
// ok otherwise. Every local trainer's loop checks its steps with it.
Status check_step_loss(int64_t step, double loss);

// optim::sgd_prox_step (w -= lr (g + mu (w - w_global))) for a model wherever it lives: on the
// CPU that function; on a device core/optim's Sgd with FedProx's term added to the gradients
// there (the same arithmetic, bit for bit), against a device copy of the global model made by
// create(). One per round; `global` must outlive it.
class ProxSgd {
 public:
  static Result<ProxSgd> create(std::vector<Tensor> params, std::span<const float> global,
                                float mu);
  void step(float lr);

 private:
  std::vector<Tensor> params_;
  std::span<const float> global_;
  float mu_ = 0.0f;
  std::unique_ptr<optim::Sgd> sgd_;  // on a device only
  std::vector<Tensor> anchor_;       // the global model on the device (mu > 0)
};

// Returns the differentiable scalar loss of step `step`; draws its batch and noise from `rng`.
using BatchLoss = std::function<Tensor(int64_t step, Rng& rng)>;

// Loads `global` into `model` (train mode), takes `steps` steps of plan.learning_rate with
// Rng(plan.seed()) driving `batch_loss` (so a round repeats bit for bit), writes local - global
// into `delta` and returns the mean training loss. A non-finite loss is an error naming the
// step. A model on a device (a GPU, moved there by its trainer) steps there: the batches'
// losses, gradients and optimizer state stay on the device; only the global model in and the
// trained model out cross to the host. REQUIRES: steps > 0.
Result<float> run_local_steps(nn::Module& model, std::span<const float> global,
                              const v1::RoundPlan& plan, int64_t steps,
                              const LocalStepOptions& options, const BatchLoss& batch_loss,
                              std::span<float> delta);

}  // namespace starling::edge_client
