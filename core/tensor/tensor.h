// Tensor: a typed, strided view over reference-counted, 64-byte aligned storage, with the
// autograd metadata (grad, grad_fn) that core/autograd fills in. Methods on Tensor are raw and
// never record autograd history; the differentiable versions live in core/ops.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor/dtype.h"
#include "core/util/status.h"

namespace starling {

namespace autograd {
class Node;
}

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

enum class DeviceType : uint8_t { kCPU, kCUDA };
struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;
  bool operator==(const Device&) const = default;
  static Device cpu() { return {}; }
  static Device cuda(int index = 0) { return {DeviceType::kCUDA, index}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
};
std::string device_str(Device d);  // "cpu", "cuda:0"

class DeviceBackend;

std::string shape_str(const Shape& s);  // "(2, 3)"
inline int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}
Strides contiguous_strides(const Shape& s);

// Owns one block of bytes: 64-byte aligned host memory, or memory of a device from its
// DeviceBackend (core/tensor/device_backend.h). Thread-compatible.
class Storage {
 public:
  explicit Storage(size_t nbytes, bool zero = true);
  // Zeroed bytes on `device` (the CPU, or a device whose backend is installed); zero = false
  // leaves a device's bytes as they come (for writers that overwrite them all). Errors name the
  // device: no backend installed, an index not present, out of memory.
  static Result<std::shared_ptr<Storage>> on_device(size_t nbytes, Device device, bool zero = true);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  Storage(void* data, size_t nbytes, Device device, DeviceBackend* backend);
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  DeviceBackend* backend_ = nullptr;  // null for host memory
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Strides strides;     // in elements
  int64_t offset = 0;  // in elements
  DType dtype = DType::kF32;
  Device device;
  // Autograd: a leaf has requires_grad and no grad_fn; its gradient accumulates in grad.
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<autograd::Node> grad_fn;
};

class Tensor {
 public:
  Tensor() = default;  // undefined
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Factories (CPU). `zeros`/`empty` both zero-fill: storage is always initialized.
  static Tensor empty(const Shape& shape, DType dtype = DType::kF32);
  // Storage left uninitialized: only for kernels that overwrite every element.
  static Tensor uninitialized(const Shape& shape, DType dtype = DType::kF32);
  static Tensor zeros(const Shape& shape, DType dtype = DType::kF32);
  static Tensor ones(const Shape& shape, DType dtype = DType::kF32);
  static Tensor full(const Shape& shape, double value, DType dtype = DType::kF32);
  static Tensor scalar(double value, DType dtype = DType::kF32);
  static Tensor arange(int64_t n, DType dtype = DType::kF32);
  static Tensor from_vector(const std::vector<float>& v, const Shape& shape);
  static Tensor from_vector(const std::vector<double>& v, const Shape& shape);
  static Tensor from_vector(const std::vector<int32_t>& v, const Shape& shape);
  // N(mean, std^2) and U[lo, hi) in f32/f64.
  static Tensor randn(const Shape& shape, class Rng& rng, double std = 1.0, double mean = 0.0,
                      DType dtype = DType::kF32);
  static Tensor uniform(const Shape& shape, class Rng& rng, double lo, double hi,
                        DType dtype = DType::kF32);
  // Zeros on `device` (any device; the CPU gives zeros()). Errors name the device.
  static Result<Tensor> zeros_on(const Shape& shape, DType dtype, Device device);
  // The same with the device's bytes left uninitialized: only for kernels that overwrite every
  // element (a device op's output), saving the memset.
  static Result<Tensor> uninitialized_on(const Shape& shape, DType dtype, Device device);

  bool defined() const { return impl_ != nullptr; }
  const std::shared_ptr<TensorImpl>& impl() const { return impl_; }

  const Shape& shape() const { return impl_->shape; }
  const Strides& strides() const { return impl_->strides; }
  int64_t dim() const { return static_cast<int64_t>(impl_->shape.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return shape_numel(impl_->shape); }
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->device; }
  int64_t offset() const { return impl_->offset; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  bool is_contiguous() const;
  // True when both share the same storage.
  bool shares_storage(const Tensor& o) const { return impl_->storage == o.impl_->storage; }
  // Whether this handle alone refers to its impl and the impl alone to its storage, laid out
  // contiguously from its start: handing the impl on can alias nothing.
  bool sole_owner() const;

  // Typed host pointer to the first element. REQUIRES: dtype matches T and the tensor is on
  // the CPU (both checked, aborting with the reason: CPU kernels never read device memory).
  template <typename T>
  T* data() const {
    check_dtype(dtype_of<T>());
    check_host();
    return static_cast<T*>(impl_->storage->data()) + impl_->offset;
  }
  void* raw_data() const {
    check_host();
    return static_cast<char*>(impl_->storage->data()) + impl_->offset * dtype_size(dtype());
  }
  // The first element's address in the memory of the tensor's device (kernels of that device).
  template <typename T>
  T* device_data() const {
    check_dtype(dtype_of<T>());
    return static_cast<T*>(impl_->storage->data()) + impl_->offset;
  }
  bool is_cpu() const { return impl_->device.is_cpu(); }
  // A copy on `device` with the same shape, dtype and values (contiguous); this when already
  // there. Goes through host memory between devices. Errors name the device.
  Result<Tensor> to(Device device) const;
  // Contiguous copy of the values as float / double (any dtype, any device).
  std::vector<float> to_float_vector() const;
  std::vector<double> to_double_vector() const;
  double item() const;  // REQUIRES: numel() == 1 (any device)

  // Views without copies (share storage). A view aliases its base.
  Tensor view(const Shape& shape) const;     // REQUIRES: contiguous; one dim may be -1
  Tensor reshape(const Shape& shape) const;  // view when contiguous, else a copy
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;  // drops `dim`
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;

  Tensor contiguous() const;     // this if already contiguous
  Tensor clone() const;          // always a fresh contiguous copy, no autograd history (any device)
  Tensor to(DType dtype) const;  // converted copy (this if same dtype)
  // Copies values from src (same shape; any dtypes) into this tensor's elements.
  void copy_from(const Tensor& src);
  void fill(double value);
  void zero() { fill(0.0); }

  // Autograd metadata. Differentiable functions are in core/ops; backward in core/autograd.
  bool requires_grad() const { return impl_ && impl_->requires_grad; }
  Tensor& set_requires_grad(bool r);
  Tensor grad() const { return impl_->grad ? Tensor(impl_->grad) : Tensor(); }
  void set_grad(const Tensor& g) { impl_->grad = g.impl_; }
  const std::shared_ptr<autograd::Node>& grad_fn() const { return impl_->grad_fn; }
  bool is_leaf() const { return impl_->grad_fn == nullptr; }
  // Same data, no history, requires_grad false.
  Tensor detach() const;

  std::string to_string(int64_t max_elems = 16) const;

 private:
  void check_dtype(DType t) const;
  void check_host() const;
  static Result<Tensor> on_device_impl(const Shape& shape, DType dtype, Device device, bool zero);
  std::shared_ptr<TensorImpl> impl_;
};

// Elementwise comparison helpers for tests: largest |a-b| and whether all are within tol.
double max_abs_diff(const Tensor& a, const Tensor& b);

}  // namespace starling
