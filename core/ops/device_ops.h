// How the differentiable ops run when their inputs live on a device (a GPU). Each op in core/ops
// checks its inputs first: all on the CPU, it runs its CPU kernels as before; any on a device,
// it hands the call to the DeviceOps installed for that device type, which computes the forward
// pass there and records its backward (autograd::record, the same inputs the CPU op records) so
// that autograd::backward walks a graph whose gradients never leave the device. The optimizers
// and clip_grad_norm (core/optim) step device parameters through the same table.
//
// core/cuda installs the CUDA table (cuda::install_tensor_backend()). Tests install a table that
// runs every op through the CPU kernels on host copies (tests/testing/emulated_device.h), so the
// routing of every model, trainer and optimizer through device tensors is checked on machines
// without a GPU, bit for bit against the CPU run.
//
// Only the ops the image models (the DDPM U-Net, the MNIST CNN) and their training steps need
// have a device form; any other op given a device tensor aborts naming itself and the device.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor/tensor.h"

namespace starling::ops {

struct DeviceAdamW {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  int64_t step = 1;  // counts from 1 (bias corrections)
};

struct DeviceSgd {
  double lr = 0.1, momentum = 0.0, weight_decay = 0.0;
  bool nesterov = false, first_step = true;
};

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  virtual const char* name() const = 0;  // "cuda"

  // Differentiable ops, as their namesakes in core/ops (f32; shapes already checked by the
  // caller where the namesake says so). Undefined optional tensors stay undefined.
  virtual Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t stride,
                        int64_t padding, const Tensor& residual) = 0;
  // group_norm (shift undefined, silu false), group_norm_silu (silu true) and
  // shifted_group_norm_silu (shift (B, C), silu true).
  virtual Tensor group_norm(const Tensor& x, const Tensor& shift, int64_t groups,
                            const Tensor& weight, const Tensor& bias, double eps, bool silu) = 0;
  virtual Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) = 0;
  enum class Unary { kSilu, kRelu, kSquare };
  virtual Tensor unary(Unary op, const Tensor& x) = 0;
  enum class Binary { kAdd, kSub, kMul };
  // REQUIRES: a and b of one shape (no broadcasting on devices).
  virtual Tensor binary(Binary op, const Tensor& a, const Tensor& b) = 0;
  virtual Tensor mul_scalar(const Tensor& a, double s) = 0;
  virtual Tensor mean(const Tensor& a) = 0;  // over every element -> shape ()
  virtual Tensor cat(const std::vector<Tensor>& parts, int64_t dim) = 0;
  virtual Tensor upsample_nearest2d(const Tensor& x, int64_t scale) = 0;
  virtual Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride) = 0;
  virtual Tensor timestep_embedding(const Tensor& t, int64_t dim, double max_period) = 0;
  virtual Tensor attention_packed(const Tensor& qkv, int64_t heads, bool causal) = 0;
  // targets: i32 on the same device.
  virtual Tensor cross_entropy(const Tensor& logits, const Tensor& targets,
                               int32_t ignore_index) = 0;

  // Optimizer steps on one parameter and its state (all f32, contiguous, on this device), the
  // arithmetic of core/optim's AdamW and Sgd.
  virtual void adamw_step(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
                          const DeviceAdamW& a) = 0;
  virtual void sgd_step(const Tensor& p, const Tensor& g, const Tensor& velocity,
                        const DeviceSgd& s) = 0;
  // The sums of squares of each g's elements in double, added in order from 0
  // (clip_grad_norm's norm over a model's gradients); one wait for them all.
  virtual double sum_squares(const std::vector<Tensor>& gs) = 0;
  // x *= s in place.
  virtual void scale_(const Tensor& x, double s) = 0;
  // ema = d ema + (1 - d) w in place, f32 (a DDPM's EMA weights; the CPU's arithmetic).
  virtual void ema_update(const Tensor& ema, const Tensor& w, float d) = 0;
};

// The table of `type` (nullptr when none is installed). Installing replaces the previous one;
// the table must outlive every op call that may reach it.
DeviceOps* device_ops(DeviceType type);
void install_device_ops(DeviceType type, DeviceOps* ops);

namespace internal {
// Whether any defined input lives on a device (the op then takes its device form).
bool any_on_device(std::initializer_list<const Tensor*> inputs);
// The table for the inputs' device. Aborts naming `op` when the defined inputs sit on different
// devices, when one is not f32 (devices run f32 only), or when no table is installed for their
// device type (a build without CUDA).
DeviceOps& device_ops_for(const char* op, std::initializer_list<const Tensor*> inputs);
}  // namespace internal

}  // namespace starling::ops
