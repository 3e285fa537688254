// Reverse-mode automatic differentiation: a tape of Nodes built by the ops in core/ops, and
// backward() which walks it. Not thread-safe: one graph is built and walked by one thread.
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include "core/tensor/tensor.h"

namespace starling::autograd {

// One recorded operation. `inputs` keeps the tensors the op read (and so the graph) alive.
class Node {
 public:
  virtual ~Node() = default;
  // Given dL/d(output), returns dL/d(inputs[i]) for each input, each with that input's shape
  // and dtype, contiguous; an undefined Tensor where the input needs no gradient.
  virtual std::vector<Tensor> backward(const Tensor& grad_output) = 0;
  virtual const char* name() const = 0;

  std::vector<Tensor> inputs;
};

using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;

class FunctionNode final : public Node {
 public:
  FunctionNode(const char* name, BackwardFn fn) : name_(name), fn_(std::move(fn)) {}
  std::vector<Tensor> backward(const Tensor& g) override { return fn_(g); }
  const char* name() const override { return name_; }

 private:
  const char* name_;
  BackwardFn fn_;
};

// Whether ops record history on this thread (true by default).
bool grad_enabled();

// Turns recording off for its lifetime (evaluation, sampling, optimizer steps).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// True when recording is on and some input requires a gradient.
bool needs_grad(std::initializer_list<const Tensor*> inputs);

// Attaches a node to `out` so that backward() reaches `inputs` through `fn`. Call only when
// needs_grad(inputs) is true. Returns `out`.
Tensor record(Tensor out, const char* name, std::vector<Tensor> inputs, BackwardFn fn);

// Called by backward() once per leaf, right after the last contribution of this walk has been
// added into leaf.grad(): nothing later in the same walk reads or writes that gradient, so the
// hook may hand it to another thread (data-parallel all-reduce) while the walk continues.
// Leaves that receive no gradient in the walk are not reported.
using LeafGradHook = std::function<void(const Tensor& leaf)>;

// Computes d(root)/d(leaf) for every leaf with requires_grad reachable from root and adds it
// into leaf.grad(). grad_output defaults to ones (root must then hold one element). The graph
// is released afterwards. on_leaf_grad, if set, is called as described above.
void backward(const Tensor& root, const Tensor& grad_output = Tensor(),
              const LeafGradHook& on_leaf_grad = {});

// dst += src elementwise. REQUIRES: same shape and float dtype; dst contiguous.
void accumulate_into(Tensor& dst, const Tensor& src);

}  // namespace starling::autograd
