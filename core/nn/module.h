// Module: owns named Parameters and child modules. Its state dict (ordered name -> tensor) is
// the unit that checkpoints store and that a federation moves between nodes.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/io/state_dict.h"
#include "core/tensor/tensor.h"
#include "core/util/status.h"

namespace starling::nn {

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Parameters of this module and its children with dotted names ("h.0.attn.c_attn.weight"),
  // in registration order. The tensors alias the module's own (no copies).
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  int64_t num_parameters() const;
  // The parameters that train (requires_grad): all of them unless some were frozen (LoRA freezes
  // the base). These are what an optimizer steps and what a federation moves.
  std::vector<std::pair<std::string, Tensor>> named_trainable_parameters() const;
  std::vector<Tensor> trainable_parameters() const;
  int64_t num_trainable_parameters() const;
  // Freezes every parameter of this module and its children (requires_grad off, no gradient
  // computed or kept for them). Parameters registered later train as usual.
  void freeze();

  // The parameters as a StateDict (aliases, not copies: clone to snapshot).
  io::StateDict state_dict() const;
  // Copies values into the parameters (dtype converted). strict: every parameter must be
  // present and no extra names allowed. Errors name the key and the shapes.
  Status load_state_dict(const io::StateDict& sd, bool strict = true);

  // Moves every parameter to `device` in place (their storage; a gradient held is dropped): the
  // handles that alias a parameter (a layer's `weight` member, an optimizer's list) follow it.
  // Parameters that share one storage through different views would be parted: none of our
  // models do that. Errors name the parameter and the device.
  Status to(Device device);

  void train(bool on = true);
  bool training() const { return training_; }
  void zero_grad();

 protected:
  // Registers `t` as a trainable parameter (sets requires_grad) and returns it.
  Tensor register_parameter(std::string name, Tensor t);
  template <typename M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> m) {
    children_.emplace_back(std::move(name), m);
    return m;
  }

 private:
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const;

  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

}  // namespace starling::nn
