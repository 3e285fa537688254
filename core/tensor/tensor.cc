// Tensor storage, factories, views and dtype conversion on the CPU.
#include "core/tensor/tensor.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>

#include "core/tensor/device_backend.h"
#include "core/util/rng.h"

namespace starling {

namespace {

[[noreturn]] void fatal(const std::string& msg) {
  std::fprintf(stderr, "starling: fatal tensor error: %s\n", msg.c_str());
  std::abort();
}

#define STARLING_TCHECK(cond, msg) \
  do {                             \
    if (!(cond)) fatal(msg);       \
  } while (0)

int64_t wrap_dim(int64_t d, int64_t ndim) {
  const int64_t w = d < 0 ? d + ndim : d;
  STARLING_TCHECK(w >= 0 && w < ndim, "dimension " + std::to_string(d) + " out of range for " +
                                          std::to_string(ndim) + "-d tensor");
  return w;
}

double load_as_double(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(base)[i];
    case DType::kF64:
      return static_cast<const double*>(base)[i];
    case DType::kBF16:
      return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kF16:
      return f16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kI32:
      return static_cast<const int32_t*>(base)[i];
    case DType::kI64:
      return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case DType::kI8:
      return static_cast<const int8_t*>(base)[i];
    case DType::kU8:
      return static_cast<const uint8_t*>(base)[i];
  }
  return 0.0;
}

void store_double(void* base, DType t, int64_t i, double v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      return;
    case DType::kF64:
      static_cast<double*>(base)[i] = v;
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(base)[i] = float_to_bf16(static_cast<float>(v));
      return;
    case DType::kF16:
      static_cast<uint16_t*>(base)[i] = float_to_f16(static_cast<float>(v));
      return;
    case DType::kI32:
      static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v);
      return;
    case DType::kI64:
      static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v);
      return;
    case DType::kI8:
      static_cast<int8_t*>(base)[i] = static_cast<int8_t>(v);
      return;
    case DType::kU8:
      static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v);
      return;
  }
}

// Copies the elements of `t` (es bytes each) in row-major order to d, whole rows at a time
// where the innermost dims (merged where one steps exactly over the next) are contiguous: a
// slice along a channel dim is then a memcpy per (image, channel) plane, not per element.
// Returns false (nothing copied) when the innermost stride is not 1.
bool copy_rows(const Tensor& t, const char* base, size_t es, char* d) {
  const auto& sh = t.shape();
  const auto& st = t.strides();
  // Merge dims from the inside out: (size, stride) pairs, innermost first.
  std::vector<int64_t> size, stride;
  for (int64_t k = t.dim() - 1; k >= 0; --k) {
    const auto ku = static_cast<size_t>(k);
    if (sh[ku] == 1) continue;
    if (!size.empty() && st[ku] == stride.back() * size.back()) {
      size.back() *= sh[ku];
      continue;
    }
    size.push_back(sh[ku]);
    stride.push_back(st[ku]);
  }
  if (size.empty() || stride.front() != 1) return false;
  const int64_t row = size.front(), n = t.numel();
  const auto nd = size.size();
  std::vector<int64_t> idx(nd, 0);
  int64_t off = t.offset();
  const auto esi = static_cast<int64_t>(es);
  for (int64_t lin = 0; lin < n; lin += row) {
    std::memcpy(d + lin * esi, base + off * esi, static_cast<size_t>(row) * es);
    for (size_t k = 1; k < nd; ++k) {
      if (++idx[k] < size[k]) {
        off += stride[k];
        break;
      }
      off -= stride[k] * (size[k] - 1);
      idx[k] = 0;
    }
  }
  return true;
}

// Calls f(src_offset, dst_linear_index) for every element of `t` in row-major order.
template <typename F>
void for_each_offset(const Tensor& t, F&& f) {
  const int64_t n = t.numel();
  if (n == 0) return;
  const int64_t nd = t.dim();
  if (nd == 0) {
    f(t.offset(), 0);
    return;
  }
  std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
  const auto& sh = t.shape();
  const auto& st = t.strides();
  int64_t off = t.offset();
  const int64_t last = nd - 1;
  for (int64_t lin = 0; lin < n;) {
    const int64_t inner = sh[last];
    const int64_t s = st[last];
    for (int64_t k = 0; k < inner; ++k) f(off + k * s, lin + k);
    lin += inner;
    // Advance the outer indices.
    for (int64_t d = last - 1; d >= 0; --d) {
      if (++idx[d] < sh[d]) {
        off += st[d];
        break;
      }
      off -= st[d] * (sh[d] - 1);
      idx[d] = 0;
    }
  }
}

}  // namespace

std::string shape_str(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + ")";
}

Strides contiguous_strides(const Shape& s) {
  Strides st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= std::max<int64_t>(s[i], 1);
  }
  return st;
}

Storage::Storage(size_t nbytes, bool zero) : nbytes_(nbytes) {
  const size_t alloc = std::max<size_t>(64, (nbytes + 63) / 64 * 64);
  data_ = std::aligned_alloc(64, alloc);
  if (data_ == nullptr) throw std::bad_alloc();
  if (zero) std::memset(data_, 0, alloc);
}

Storage::Storage(void* data, size_t nbytes, Device device, DeviceBackend* backend)
    : data_(data), nbytes_(nbytes), device_(device), backend_(backend) {}

Storage::~Storage() {
  if (backend_ != nullptr) {
    if (data_ != nullptr) backend_->release(device_.index, data_, nbytes_);
  } else {
    std::free(data_);
  }
}

namespace {
std::array<std::atomic<DeviceBackend*>, 2> g_backends{};  // by DeviceType
}  // namespace

Result<void*> DeviceBackend::allocate_uninitialized(int index, size_t nbytes) {
  return allocate(index, nbytes);
}

Status DeviceBackend::gather(void*, const void*, int, const int64_t*, const int64_t*, size_t, int) {
  return unimplemented(std::string(name()) + " has no strided gather");
}

Status DeviceBackend::accumulate_f32(float*, const float*, size_t, int) {
  return unimplemented(std::string(name()) + " has no accumulate");
}

DeviceBackend* device_backend(DeviceType type) {
  const auto i = static_cast<size_t>(type);
  return i < g_backends.size() ? g_backends[i].load() : nullptr;
}

DeviceBackend* install_device_backend(DeviceType type, DeviceBackend* backend) {
  const auto i = static_cast<size_t>(type);
  STARLING_TCHECK(type != DeviceType::kCPU && i < g_backends.size(),
                  "install_device_backend: not a device type with a backend");
  return g_backends[i].exchange(backend);
}

std::string device_str(Device d) {
  if (d.is_cpu()) return "cpu";
  return std::string(d.type == DeviceType::kCUDA ? "cuda" : "device") + ":" +
         std::to_string(d.index);
}

Result<std::shared_ptr<Storage>> Storage::on_device(size_t nbytes, Device device, bool zero) {
  if (device.is_cpu()) return std::make_shared<Storage>(nbytes, zero);
  DeviceBackend* backend = device_backend(device.type);
  if (backend == nullptr) {
    return failed_precondition(device_str(device) +
                               ": no backend for this device type in this process (a CPU-only "
                               "build, or the CUDA backend not installed)");
  }
  const int count = backend->device_count();
  if (device.index < 0 || device.index >= count) {
    return invalid_argument(device_str(device) + ": no such device (" + std::to_string(count) +
                            " present)");
  }
  void* p = nullptr;
  if (nbytes > 0) {
    auto r = zero ? backend->allocate(device.index, nbytes)
                  : backend->allocate_uninitialized(device.index, nbytes);
    if (!r.ok()) return r.status().with_context(device_str(device));
    p = *r;
  }
  return std::shared_ptr<Storage>(new Storage(p, nbytes, device, backend));
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  for (int64_t d : shape)
    STARLING_TCHECK(d >= 0, "negative dimension in shape " + shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage =
      std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype));
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::uninitialized(const Shape& shape, DType dtype) {
  for (int64_t d : shape)
    STARLING_TCHECK(d >= 0, "negative dimension in shape " + shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage =
      std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), false);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) { return empty(shape, dtype); }

Result<Tensor> Tensor::zeros_on(const Shape& shape, DType dtype, Device device) {
  if (device.is_cpu()) return zeros(shape, dtype);
  return on_device_impl(shape, dtype, device, true);
}

Result<Tensor> Tensor::uninitialized_on(const Shape& shape, DType dtype, Device device) {
  if (device.is_cpu()) return uninitialized(shape, dtype);
  return on_device_impl(shape, dtype, device, false);
}

Result<Tensor> Tensor::on_device_impl(const Shape& shape, DType dtype, Device device, bool zero) {
  for (int64_t d : shape) {
    if (d < 0) return invalid_argument("negative dimension in shape " + shape_str(shape));
  }
  auto impl = std::make_shared<TensorImpl>();
  ASSIGN_OR_RETURN(impl->storage,
                   Storage::on_device(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype),
                                      device, zero));
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->device = device;
  return Tensor(std::move(impl));
}

Result<Tensor> Tensor::to(Device device) const {
  STARLING_TCHECK(impl_ != nullptr, "to(device) of an undefined tensor");
  if (device == impl_->device) return *this;
  Tensor host;
  if (is_cpu()) {
    host = contiguous();
  } else {
    // The device bytes this view reaches (only its own range when contiguous), then the view's
    // layout applied on the host.
    DeviceBackend* backend = device_backend(impl_->device.type);
    const size_t es = dtype_size(dtype());
    const bool dense = is_contiguous();
    const size_t from = dense ? static_cast<size_t>(impl_->offset) * es : 0;
    const size_t bytes = dense ? nbytes() : impl_->storage->nbytes();
    auto staging = std::make_shared<Storage>(bytes, false);
    if (bytes > 0) {
      RETURN_IF_ERROR(
          backend->copy(staging->data(), static_cast<const char*>(impl_->storage->data()) + from,
                        bytes, DeviceBackend::Direction::kDeviceToHost, impl_->device.index),
          device_str(impl_->device) + " to host");
    }
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = std::move(staging);
    impl->shape = impl_->shape;
    impl->strides = impl_->strides;
    impl->offset = dense ? 0 : impl_->offset;
    impl->dtype = impl_->dtype;
    host = Tensor(std::move(impl)).contiguous();
  }
  if (device.is_cpu()) return host;
  ASSIGN_OR_RETURN(Tensor out, uninitialized_on(shape(), dtype(), device));
  if (out.nbytes() > 0) {
    RETURN_IF_ERROR(device_backend(device.type)
                        ->copy(out.impl_->storage->data(), host.raw_data(), out.nbytes(),
                               DeviceBackend::Direction::kHostToDevice, device.index),
                    "host to " + device_str(device));
  }
  return out;
}

Tensor Tensor::ones(const Shape& shape, DType dtype) { return full(shape, 1.0, dtype); }

Tensor Tensor::full(const Shape& shape, double value, DType dtype) {
  Tensor t = empty(shape, dtype);
  t.fill(value);
  return t;
}

Tensor Tensor::scalar(double value, DType dtype) { return full({}, value, dtype); }

Tensor Tensor::arange(int64_t n, DType dtype) {
  Tensor t = empty({n}, dtype);
  void* p = t.raw_data();
  for (int64_t i = 0; i < n; ++i) store_double(p, dtype, i, static_cast<double>(i));
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& v, const Shape& shape) {
  STARLING_TCHECK(
      static_cast<int64_t>(v.size()) == shape_numel(shape),
      "from_vector: " + std::to_string(v.size()) + " values for shape " + shape_str(shape));
  Tensor t = empty(shape, DType::kF32);
  std::memcpy(t.raw_data(), v.data(), v.size() * sizeof(float));
  return t;
}

Tensor Tensor::from_vector(const std::vector<double>& v, const Shape& shape) {
  STARLING_TCHECK(
      static_cast<int64_t>(v.size()) == shape_numel(shape),
      "from_vector: " + std::to_string(v.size()) + " values for shape " + shape_str(shape));
  Tensor t = empty(shape, DType::kF64);
  std::memcpy(t.raw_data(), v.data(), v.size() * sizeof(double));
  return t;
}

Tensor Tensor::from_vector(const std::vector<int32_t>& v, const Shape& shape) {
  STARLING_TCHECK(
      static_cast<int64_t>(v.size()) == shape_numel(shape),
      "from_vector: " + std::to_string(v.size()) + " values for shape " + shape_str(shape));
  Tensor t = empty(shape, DType::kI32);
  std::memcpy(t.raw_data(), v.data(), v.size() * sizeof(int32_t));
  return t;
}

Tensor Tensor::randn(const Shape& shape, Rng& rng, double std, double mean, DType dtype) {
  Tensor t = empty(shape, dtype);
  void* p = t.raw_data();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) store_double(p, dtype, i, mean + std * rng.normal());
  return t;
}

Tensor Tensor::uniform(const Shape& shape, Rng& rng, double lo, double hi, DType dtype) {
  Tensor t = empty(shape, dtype);
  void* p = t.raw_data();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) store_double(p, dtype, i, lo + (hi - lo) * rng.uniform());
  return t;
}

int64_t Tensor::size(int64_t d) const { return impl_->shape[wrap_dim(d, dim())]; }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (impl_->shape[i] == 1) continue;
    if (impl_->strides[i] != expected) return false;
    expected *= impl_->shape[i];
  }
  return true;
}

void Tensor::check_host() const {
  STARLING_TCHECK(impl_ != nullptr, "access to an undefined tensor");
  STARLING_TCHECK(impl_->device.is_cpu(),
                  "host access to a tensor on " + device_str(impl_->device) +
                      ": CPU kernels read host memory only; copy it with to(Device::cpu())");
}

namespace {
// The host copy of a device tensor for reading its values (aborts if the copy fails).
Tensor host_copy(const Tensor& t) {
  auto h = t.to(Device::cpu());
  STARLING_TCHECK(h.ok(),
                  "reading a tensor on " + device_str(t.device()) + ": " + h.status().to_string());
  return *h;
}
}  // namespace

void Tensor::check_dtype(DType t) const {
  STARLING_TCHECK(impl_ != nullptr, "access to an undefined tensor");
  STARLING_TCHECK(t == impl_->dtype, std::string("tensor holds ") +
                                         std::string(dtype_name(impl_->dtype)) + ", accessed as " +
                                         std::string(dtype_name(t)));
}

std::vector<float> Tensor::to_float_vector() const {
  if (!is_cpu()) return host_copy(*this).to_float_vector();
  std::vector<float> out(static_cast<size_t>(numel()));
  const void* base = impl_->storage->data();
  const DType t = dtype();
  for_each_offset(*this, [&](int64_t off, int64_t i) {
    out[static_cast<size_t>(i)] = static_cast<float>(load_as_double(base, t, off));
  });
  return out;
}

std::vector<double> Tensor::to_double_vector() const {
  if (!is_cpu()) return host_copy(*this).to_double_vector();
  std::vector<double> out(static_cast<size_t>(numel()));
  const void* base = impl_->storage->data();
  const DType t = dtype();
  for_each_offset(*this, [&](int64_t off, int64_t i) {
    out[static_cast<size_t>(i)] = load_as_double(base, t, off);
  });
  return out;
}

double Tensor::item() const {
  STARLING_TCHECK(numel() == 1, "item() on a tensor of shape " + shape_str(shape()));
  if (!is_cpu()) return host_copy(*this).item();
  return load_as_double(impl_->storage->data(), dtype(), impl_->offset);
}

Tensor Tensor::view(const Shape& shape) const {
  STARLING_TCHECK(is_contiguous(), "view() of a non-contiguous tensor " + shape_str(this->shape()));
  Shape s = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      STARLING_TCHECK(infer < 0, "view(): more than one -1 in " + shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) s[infer] = known == 0 ? 0 : numel() / known;
  STARLING_TCHECK(shape_numel(s) == numel(),
                  "view(): cannot view " + shape_str(this->shape()) + " as " + shape_str(shape));
  auto impl = std::make_shared<TensorImpl>(*impl_);
  impl->shape = s;
  impl->strides = contiguous_strides(s);
  impl->grad = nullptr;
  impl->grad_fn = nullptr;
  impl->requires_grad = false;
  return Tensor(std::move(impl));
}

Tensor Tensor::reshape(const Shape& shape) const {
  return is_contiguous() ? view(shape) : contiguous().view(shape);
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  std::vector<int64_t> perm(static_cast<size_t>(dim()));
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
  std::swap(perm[wrap_dim(d0, dim())], perm[wrap_dim(d1, dim())]);
  return permute(perm);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  STARLING_TCHECK(static_cast<int64_t>(dims.size()) == dim(), "permute(): wrong number of dims");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->offset = impl_->offset;
  impl->dtype = impl_->dtype;
  impl->device = impl_->device;
  std::vector<bool> seen(dims.size(), false);
  for (int64_t d : dims) {
    const int64_t w = wrap_dim(d, dim());
    STARLING_TCHECK(!seen[w], "permute(): repeated dim");
    seen[w] = true;
    impl->shape.push_back(impl_->shape[w]);
    impl->strides.push_back(impl_->strides[w]);
  }
  return Tensor(std::move(impl));
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  d = wrap_dim(d, dim());
  const int64_t n = impl_->shape[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  STARLING_TCHECK(step > 0, "slice(): step must be positive");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->dtype = impl_->dtype;
  impl->device = impl_->device;
  impl->shape = impl_->shape;
  impl->strides = impl_->strides;
  impl->offset = impl_->offset + start * impl_->strides[d];
  impl->shape[d] = (end - start + step - 1) / step;
  impl->strides[d] *= step;
  return Tensor(std::move(impl));
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = wrap_dim(d, dim());
  STARLING_TCHECK(index >= 0 && index < impl_->shape[d], "select(): index out of range");
  Tensor s = slice(d, index, index + 1);
  s.impl_->shape.erase(s.impl_->shape.begin() + d);
  s.impl_->strides.erase(s.impl_->strides.begin() + d);
  return s;
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim(d, dim() + 1);
  auto impl = std::make_shared<TensorImpl>(*impl_);
  impl->grad = nullptr;
  impl->grad_fn = nullptr;
  impl->requires_grad = false;
  const int64_t st = d < dim() ? impl_->strides[d] * impl_->shape[d] : 1;
  impl->shape.insert(impl->shape.begin() + d, 1);
  impl->strides.insert(impl->strides.begin() + d, st);
  return Tensor(std::move(impl));
}

Tensor Tensor::squeeze(int64_t d) const {
  d = wrap_dim(d, dim());
  STARLING_TCHECK(impl_->shape[d] == 1, "squeeze(): dim is not of size 1");
  auto impl = std::make_shared<TensorImpl>(*impl_);
  impl->grad = nullptr;
  impl->grad_fn = nullptr;
  impl->requires_grad = false;
  impl->shape.erase(impl->shape.begin() + d);
  impl->strides.erase(impl->strides.begin() + d);
  return Tensor(std::move(impl));
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  if (!is_cpu() && is_contiguous()) {  // device to device
    auto out = uninitialized_on(shape(), dtype(), device());
    STARLING_TCHECK(out.ok(),
                    "clone() on " + device_str(device()) + ": " + out.status().to_string());
    if (nbytes() > 0) {
      const Status st =
          device_backend(device().type)
              ->copy(out->impl_->storage->data(),
                     static_cast<const char*>(impl_->storage->data()) +
                         impl_->offset * dtype_size(dtype()),
                     nbytes(), DeviceBackend::Direction::kDeviceToDevice, device().index);
      STARLING_TCHECK(st.ok(), "clone() on " + device_str(device()) + ": " + st.to_string());
    }
    return *out;
  }
  if (!is_cpu() && numel() > 0) {  // a strided view: the device's gather when it has one
    auto out = uninitialized_on(shape(), dtype(), device());
    STARLING_TCHECK(out.ok(),
                    "clone() on " + device_str(device()) + ": " + out.status().to_string());
    const Status st = device_backend(device().type)
                          ->gather(out->impl_->storage->data(),
                                   static_cast<const char*>(impl_->storage->data()) +
                                       impl_->offset * dtype_size(dtype()),
                                   static_cast<int>(dim()), shape().data(), strides().data(),
                                   dtype_size(dtype()), device().index);
    if (st.ok()) return *out;
    STARLING_TCHECK(st.code() == StatusCode::kUnimplemented,
                    "clone() on " + device_str(device()) + ": " + st.to_string());
  }
  if (!is_cpu()) {  // a strided view: laid out contiguously through the host
    auto back = host_copy(*this).to(device());
    STARLING_TCHECK(back.ok(),
                    "clone() on " + device_str(device()) + ": " + back.status().to_string());
    return *back;
  }
  Tensor out = uninitialized(shape(), dtype());  // copy_from writes every element
  out.copy_from(*this);
  return out;
}

bool Tensor::sole_owner() const {
  return impl_ != nullptr && impl_.use_count() == 1 && impl_->storage.use_count() == 1 &&
         impl_->offset == 0 && is_contiguous();
}

Tensor Tensor::to(DType t) const {
  if (t == dtype()) return *this;
  Tensor out = uninitialized(shape(), t);
  out.copy_from(*this);
  return out;
}

void Tensor::copy_from(const Tensor& src) {
  STARLING_TCHECK(src.shape() == shape(),
                  "copy_from(): shape " + shape_str(src.shape()) + " into " + shape_str(shape()));
  const int64_t n = numel();
  if (n == 0) return;
  if (src.dtype() == dtype() && src.is_contiguous() && is_contiguous()) {
    std::memmove(raw_data(), src.raw_data(), nbytes());
    return;
  }
  if (is_contiguous()) {
    if (dtype() == src.dtype()) {  // exact bytes: no rounding of i64, NaN payloads kept
      const size_t es = dtype_size(dtype());
      const char* sbase = static_cast<const char*>(src.impl_->storage->data());
      char* d = static_cast<char*>(raw_data());
      if (copy_rows(src, sbase, es, d)) return;
      if (es == 4) {
        for_each_offset(
            src, [&](int64_t off, int64_t i) { std::memcpy(d + i * 4, sbase + off * 4, 4); });
      } else {
        for_each_offset(
            src, [&](int64_t off, int64_t i) { std::memcpy(d + i * es, sbase + off * es, es); });
      }
      return;
    }
    const void* sbase = src.impl_->storage->data();
    void* d = raw_data();
    const DType st = src.dtype(), dt = dtype();
    for_each_offset(src, [&](int64_t off, int64_t i) {
      store_double(d, dt, i, load_as_double(sbase, st, off));
    });
    return;
  }
  // Non-contiguous destination: go through a contiguous copy of the source.
  const Tensor s = src.to(dtype()).contiguous();
  const void* sp = s.raw_data();
  void* dbase = impl_->storage->data();
  const DType dt = dtype();
  for_each_offset(*this, [&](int64_t off, int64_t i) {
    store_double(dbase, dt, off, load_as_double(sp, dt, i));
  });
}

void Tensor::fill(double value) {
  if (is_contiguous() && dtype() == DType::kF32) {
    std::fill_n(data<float>(), numel(), static_cast<float>(value));
    return;
  }
  void* base = impl_->storage->data();
  const DType t = dtype();
  for_each_offset(*this, [&](int64_t off, int64_t) { store_double(base, t, off, value); });
}

Tensor& Tensor::set_requires_grad(bool r) {
  STARLING_TCHECK(!r || dtype_is_float(dtype()), "requires_grad on a non-float tensor");
  impl_->requires_grad = r;
  return *this;
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>(*impl_);
  impl->grad = nullptr;
  impl->grad_fn = nullptr;
  impl->requires_grad = false;
  return Tensor(std::move(impl));
}

std::string Tensor::to_string(int64_t max_elems) const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream os;
  os << "Tensor(" << dtype_name(dtype()) << ", " << shape_str(shape());
  if (!is_cpu()) os << ", " << device_str(device());
  os << ", [";
  const auto v = to_double_vector();
  for (int64_t i = 0; i < std::min<int64_t>(max_elems, numel()); ++i) os << (i ? ", " : "") << v[i];
  if (numel() > max_elems) os << ", ...";
  os << "])";
  return os.str();
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  STARLING_TCHECK(a.shape() == b.shape(),
                  "max_abs_diff(): shape " + shape_str(a.shape()) + " vs " + shape_str(b.shape()));
  const auto va = a.to_double_vector();
  const auto vb = b.to_double_vector();
  double m = 0.0;
  for (size_t i = 0; i < va.size(); ++i) {
    const double d = std::fabs(va[i] - vb[i]);
    if (std::isnan(d)) return d;
    m = std::max(m, d);
  }
  return m;
}

}  // namespace starling
