// Parameter registry, state dict import/export, train/eval switching.
#include "core/nn/module.h"

#include <unordered_map>
#include <unordered_set>

namespace starling::nn {

Tensor Module::register_parameter(std::string name, Tensor t) {
  t.set_requires_grad(true);
  params_.emplace_back(std::move(name), t);
  return t;
}

void Module::collect(const std::string& prefix,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [name, t] : params_) out.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& t : parameters()) n += t.numel();
  return n;
}

std::vector<std::pair<std::string, Tensor>> Module::named_trainable_parameters() const {
  auto all = named_parameters();
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [name, t] : all) {
    if (t.requires_grad()) out.emplace_back(std::move(name), t);
  }
  return out;
}

std::vector<Tensor> Module::trainable_parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_trainable_parameters()) out.push_back(t);
  return out;
}

int64_t Module::num_trainable_parameters() const {
  int64_t n = 0;
  for (const auto& t : trainable_parameters()) n += t.numel();
  return n;
}

void Module::freeze() {
  for (auto& t : parameters()) {
    t.set_requires_grad(false);
    t.impl()->grad = nullptr;
  }
}

io::StateDict Module::state_dict() const { return named_parameters(); }

Status Module::load_state_dict(const io::StateDict& sd, bool strict) {
  std::unordered_map<std::string, const Tensor*> given;
  for (const auto& [name, t] : sd) given.emplace(name, &t);
  std::unordered_set<std::string> used;
  for (auto& [name, param] : named_parameters()) {
    auto it = given.find(name);
    if (it == given.end()) {
      if (strict) return not_found("state dict has no tensor '" + name + "'");
      continue;
    }
    const Tensor& src = *it->second;
    if (src.shape() != param.shape()) {
      return invalid_argument("tensor '" + name + "' has shape " + shape_str(src.shape()) +
                              ", the model expects " + shape_str(param.shape()));
    }
    if (!dtype_is_float(src.dtype())) {
      return invalid_argument("tensor '" + name + "' has non-float dtype " +
                              std::string(dtype_name(src.dtype())));
    }
    param.copy_from(src);
    used.insert(name);
  }
  if (strict) {
    for (const auto& [name, t] : sd) {
      if (!used.count(name))
        return invalid_argument("unexpected tensor '" + name + "' in state dict");
    }
  }
  return ok_status();
}

Status Module::to(Device device) {
  for (auto& [name, p] : named_parameters()) {
    if (p.device() == device) continue;
    auto moved = p.to(device);
    if (!moved.ok()) {
      return Status(moved.status().code(), "parameter '" + name + "' to " + device_str(device) +
                                               ": " + moved.status().message());
    }
    TensorImpl& impl = *p.impl();
    impl.storage = moved->impl()->storage;
    impl.strides = moved->impl()->strides;
    impl.offset = moved->impl()->offset;
    impl.device = device;
    impl.grad = nullptr;
  }
  return ok_status();
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::zero_grad() {
  for (auto& t : parameters()) t.impl()->grad = nullptr;
}

}  // namespace starling::nn
