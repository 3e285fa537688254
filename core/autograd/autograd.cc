// The backward walk: topological order over tensors, gradients summed per tensor.
#include "core/autograd/autograd.h"

#include <cstdio>
#include <cstdlib>
#include <unordered_map>
#include <unordered_set>

#include "core/tensor/device_backend.h"

namespace starling::autograd {

namespace {
thread_local bool g_grad_enabled = true;

[[noreturn]] void fatal(const std::string& msg) {
  std::fprintf(stderr, "starling: fatal autograd error: %s\n", msg.c_str());
  std::abort();
}

template <typename T>
void add_loop(T* d, const T* s, int64_t n) {
#pragma omp parallel for simd if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) d[i] += s[i];
}

template <typename T>
void sum_loop(T* d, const T* a, const T* b, int64_t n) {
#pragma omp parallel for simd if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) d[i] = a[i] + b[i];
}

// a + b in a new tensor where a may not be written (shared): one pass where a copy of a and
// then an add would take two. The same sums as accumulate_into(a.clone(), b).
Tensor sum_to_new(const Tensor& a, const Tensor& b) {
  if (a.shape() == b.shape() && a.dtype() == b.dtype() && a.is_contiguous() && b.is_contiguous() &&
      (a.dtype() == DType::kF32 || a.dtype() == DType::kF64)) {
    Tensor out = Tensor::uninitialized(a.shape(), a.dtype());
    if (a.dtype() == DType::kF32)
      sum_loop(out.data<float>(), a.data<float>(), b.data<float>(), a.numel());
    else
      sum_loop(out.data<double>(), a.data<double>(), b.data<double>(), a.numel());
    return out;
  }
  Tensor out = a.clone();
  accumulate_into(out, b);
  return out;
}
// dst += src where either lives on a device: the device's own add when its backend has one,
// else through host memory.
void accumulate_on_device(Tensor& dst, const Tensor& src) {
  if (dst.device() != src.device()) {
    fatal("gradient on " + device_str(src.device()) + " for a tensor on " +
          device_str(dst.device()));
  }
  if (dst.dtype() != DType::kF32 || src.dtype() != DType::kF32 || !dst.is_contiguous()) {
    fatal("gradient accumulation on " + device_str(dst.device()) + " takes contiguous f32 tensors");
  }
  const Tensor s = src.contiguous();
  DeviceBackend* backend = device_backend(dst.device().type);
  const Status st = backend->accumulate_f32(dst.device_data<float>(), s.device_data<float>(),
                                            static_cast<size_t>(dst.numel()), dst.device().index);
  if (st.ok()) return;
  if (st.code() != StatusCode::kUnimplemented) {
    fatal("gradient accumulation on " + device_str(dst.device()) + ": " + st.to_string());
  }
  auto hd = dst.to(Device::cpu());
  auto hs = s.to(Device::cpu());
  if (!hd.ok() || !hs.ok()) fatal("gradient accumulation: copy to the host failed");
  Tensor h = *hd;  // to() made a host copy of its own
  accumulate_into(h, *hs);
  const Status back = backend->copy(dst.device_data<float>(), h.data<float>(), h.nbytes(),
                                    DeviceBackend::Direction::kHostToDevice, dst.device().index);
  if (!back.ok()) fatal("gradient accumulation: copy back: " + back.to_string());
}

}  // namespace

bool grad_enabled() { return g_grad_enabled; }

NoGradGuard::NoGradGuard() : prev_(g_grad_enabled) { g_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { g_grad_enabled = prev_; }

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!g_grad_enabled) return false;
  for (const Tensor* t : inputs) {
    if (t != nullptr && t->defined() && t->requires_grad()) return true;
  }
  return false;
}

Tensor record(Tensor out, const char* name, std::vector<Tensor> inputs, BackwardFn fn) {
  auto node = std::make_shared<FunctionNode>(name, std::move(fn));
  node->inputs = std::move(inputs);
  out.impl()->grad_fn = std::move(node);
  out.impl()->requires_grad = true;
  return out;
}

void accumulate_into(Tensor& dst, const Tensor& src) {
  if (dst.shape() != src.shape()) {
    fatal("gradient of shape " + shape_str(src.shape()) + " for tensor of shape " +
          shape_str(dst.shape()));
  }
  if (!dst.is_cpu() || !src.is_cpu()) {
    accumulate_on_device(dst, src);
    return;
  }
  const Tensor s = src.dtype() == dst.dtype() ? src.contiguous() : src.to(dst.dtype()).contiguous();
  if (dst.dtype() == DType::kF32) {
    add_loop(dst.data<float>(), s.data<float>(), dst.numel());
  } else if (dst.dtype() == DType::kF64) {
    add_loop(dst.data<double>(), s.data<double>(), dst.numel());
  } else {
    fatal("gradient accumulation into " + std::string(dtype_name(dst.dtype())));
  }
}

void backward(const Tensor& root, const Tensor& grad_output, const LeafGradHook& on_leaf_grad) {
  if (!root.requires_grad()) fatal("backward() on a tensor that does not require grad");
  Tensor g0 = grad_output;
  if (!g0.defined()) {
    if (root.numel() != 1) fatal("backward() without grad_output needs a one-element root");
    g0 = Tensor::ones(root.shape(), root.dtype());
    if (!root.is_cpu()) {
      auto on = g0.to(root.device());
      if (!on.ok()) fatal("backward(): the seed gradient: " + on.status().to_string());
      g0 = *on;
    }
  }
  NoGradGuard no_grad;

  // Iterative DFS post-order over tensors that carry a grad_fn.
  // `order` owns the tensors: releasing a node below may drop the last other reference.
  std::vector<std::shared_ptr<TensorImpl>> order;
  std::unordered_set<TensorImpl*> visited;
  std::vector<std::pair<std::shared_ptr<TensorImpl>, size_t>> stack;
  stack.emplace_back(root.impl(), 0);
  visited.insert(root.impl().get());
  while (!stack.empty()) {
    auto& [t, next] = stack.back();
    Node* node = t->grad_fn.get();
    if (node != nullptr && next < node->inputs.size()) {
      std::shared_ptr<TensorImpl> in = node->inputs[next++].impl();
      if (in != nullptr && in->requires_grad && visited.insert(in.get()).second) {
        stack.emplace_back(std::move(in), 0);
      }
      continue;
    }
    order.push_back(std::move(t));
    stack.pop_back();
  }

  std::unordered_map<TensorImpl*, Tensor> grads;
  grads.emplace(root.impl().get(), g0.contiguous());
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    TensorImpl* t = it->get();
    auto git = grads.find(t);
    if (git == grads.end()) continue;
    Tensor g = std::move(git->second);
    grads.erase(git);
    if (t->grad_fn == nullptr) {
      if (!t->grad) {
        // A gradient nothing else refers to becomes the leaf's as it is (no copy per step).
        t->grad = g.sole_owner() ? g.impl() : g.clone().impl();
      } else {
        Tensor acc(t->grad);
        accumulate_into(acc, g);
      }
      // Topological order: every node that feeds this leaf has run, so its gradient is final.
      if (on_leaf_grad) on_leaf_grad(Tensor(*it));
      continue;
    }
    std::shared_ptr<Node> node = std::move(t->grad_fn);  // releases the graph as we go
    t->grad_fn = nullptr;
    std::vector<Tensor> gins = node->backward(g);
    for (size_t i = 0; i < node->inputs.size() && i < gins.size(); ++i) {
      const Tensor& in = node->inputs[i];
      if (!in.defined() || !in.requires_grad() || !gins[i].defined()) continue;
      auto [slot, inserted] = grads.try_emplace(in.impl().get(), gins[i]);
      if (!inserted) {
        if (slot->second.shares_storage(gins[i]) || slot->second.impl().use_count() > 1) {
          slot->second = sum_to_new(slot->second, gins[i]);
        } else {
          accumulate_into(slot->second, gins[i]);
        }
      }
    }
  }
}

}  // namespace starling::autograd
