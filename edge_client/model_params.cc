// Flat parameter vectors.
#include "edge_client/model_params.h"

#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include "core/cuda/tensor_backend.h"
#include "core/tensor/device_backend.h"

namespace starling::edge_client {

compress::Layout layout_of(const nn::Module& module) {
  compress::Layout layout;
  int64_t offset = 0;
  for (const auto& [name, t] : module.named_trainable_parameters()) {
    layout.push_back({name, t.shape(), offset});
    offset += t.numel();
  }
  return layout;
}

std::vector<float> flatten(const nn::Module& module) {
  std::vector<float> out;
  out.reserve(static_cast<size_t>(module.num_trainable_parameters()));
  for (const auto& t : module.trainable_parameters()) {
    if (!t.is_cpu()) {  // a model on a GPU: one copy to the host per tensor
      const std::vector<float> v = t.to_float_vector();
      out.insert(out.end(), v.begin(), v.end());
      continue;
    }
    const Tensor c = t.contiguous();
    out.insert(out.end(), c.data<float>(), c.data<float>() + c.numel());
  }
  return out;
}

Status load_flat(nn::Module& module, std::span<const float> flat) {
  if (static_cast<int64_t>(flat.size()) != module.num_trainable_parameters()) {
    return invalid_argument("flat vector of " + std::to_string(flat.size()) + " for a model of " +
                            std::to_string(module.num_trainable_parameters()) +
                            " trainable parameters");
  }
  size_t at = 0;
  for (auto& t : module.trainable_parameters()) {
    if (!t.is_cpu()) {  // into the parameter's own device memory
      if (!t.is_contiguous() || t.dtype() != DType::kF32) {
        return invalid_argument("a strided or non-f32 parameter on " + device_str(t.device()));
      }
      RETURN_IF_ERROR(device_backend(t.device().type)
                          ->copy(t.device_data<float>(), flat.data() + at, t.nbytes(),
                                 DeviceBackend::Direction::kHostToDevice, t.device().index),
                      "model to " + device_str(t.device()));
    } else {
      std::memcpy(t.data<float>(), flat.data() + at, t.nbytes());
    }
    at += static_cast<size_t>(t.numel());
  }
  return ok_status();
}

Status prepare_device(Device device) {
  if (device.is_cpu()) return ok_status();
  if (device.type == DeviceType::kCUDA && device_backend(DeviceType::kCUDA) == nullptr) {
    RETURN_IF_ERROR(cuda::install_tensor_backend(), device_str(device));
  }
  const DeviceBackend* backend = device_backend(device.type);
  if (backend == nullptr) return failed_precondition(device_str(device) + ": no backend");
  if (device.index < 0 || device.index >= backend->device_count()) {
    return failed_precondition(device_str(device) + " is not visible (" +
                               std::to_string(backend->device_count()) + " GPUs visible)");
  }
  return ok_status();
}

namespace {

std::string shape_text(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

io::StateDict layout_tensors(const compress::Layout& layout, std::span<const float> flat) {
  io::StateDict sd;
  sd.reserve(layout.size());
  for (const auto& info : layout) {
    Tensor t = Tensor::uninitialized(info.shape);
    if (t.nbytes() > 0) std::memcpy(t.data<float>(), flat.data() + info.offset, t.nbytes());
    sd.emplace_back(info.name, std::move(t));
  }
  return sd;
}

Status read_layout_tensors(const io::SafetensorsFile& file, const compress::Layout& layout,
                           std::span<float> flat, std::string_view source, bool allow_non_finite) {
  const std::string src(source);
  std::set<std::string> expected;
  for (const auto& info : layout) expected.insert(info.name);
  for (const auto& [name, t] : file.tensors) {
    if (!expected.count(name)) {
      return invalid_argument(src + ": tensor '" + name + "' is not in the federation's model (" +
                              std::to_string(layout.size()) + " tensors, e.g. '" +
                              (layout.empty() ? std::string() : layout.front().name) + "')");
    }
  }
  std::map<std::string_view, const Tensor*> by_name;
  for (const auto& [name, t] : file.tensors) by_name.emplace(name, &t);
  for (const auto& info : layout) {
    const auto it = by_name.find(info.name);
    if (it == by_name.end())
      return invalid_argument(src + ": tensor '" + info.name + "' is missing");
    const Tensor* found = it->second;
    if (found->shape() != info.shape) {
      return invalid_argument(src + ": tensor '" + info.name + "' has shape " +
                              shape_text(found->shape()) + ", the model's is " +
                              shape_text(info.shape));
    }
    if (!dtype_is_float(found->dtype())) {
      return invalid_argument(src + ": tensor '" + info.name + "' is " +
                              std::string(dtype_safetensors_name(found->dtype())) +
                              ", not a float dtype");
    }
    const Tensor f = found->to(DType::kF32).contiguous();
    const float* v = f.data<float>();
    const int64_t n = f.numel();
    if (!allow_non_finite) {
      for (int64_t i = 0; i < n; ++i) {
        if (!std::isfinite(v[i])) {
          return invalid_argument(src + ": tensor '" + info.name + "' holds " +
                                  std::to_string(v[i]) + " at element " + std::to_string(i));
        }
      }
    }
    if (n > 0) std::memcpy(flat.data() + info.offset, v, static_cast<size_t>(n) * 4);
  }
  return ok_status();
}

Result<compress::Layout> layout_of_file(const io::SafetensorsFile& file, std::string_view source,
                                        std::vector<float>* values) {
  compress::Layout layout;
  int64_t offset = 0;
  for (const auto& [name, t] : file.tensors) {
    if (!dtype_is_float(t.dtype())) {
      return invalid_argument(std::string(source) + ": tensor '" + name + "' is " +
                              std::string(dtype_safetensors_name(t.dtype())) +
                              ", not a float dtype (a federated model is moved as f32)");
    }
    layout.push_back({name, t.shape(), offset});
    offset += t.numel();
  }
  if (layout.empty()) return invalid_argument(std::string(source) + ": holds no tensors");
  if (values != nullptr) {
    values->assign(static_cast<size_t>(offset), 0.0f);
    RETURN_IF_ERROR(read_layout_tensors(file, layout, *values, source));
  }
  return layout;
}

}  // namespace starling::edge_client
