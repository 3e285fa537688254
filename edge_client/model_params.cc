// Flat parameter vectors.
#include "edge_client/model_params.h"

#include <cstring>

namespace starling::edge_client {

compress::Layout layout_of(const nn::Module& module) {
  compress::Layout layout;
  int64_t offset = 0;
  for (const auto& [name, t] : module.named_parameters()) {
    layout.push_back({name, t.shape(), offset});
    offset += t.numel();
  }
  return layout;
}

std::vector<float> flatten(const nn::Module& module) {
  std::vector<float> out;
  out.reserve(static_cast<size_t>(module.num_parameters()));
  for (const auto& t : module.parameters()) {
    const Tensor c = t.contiguous();
    out.insert(out.end(), c.data<float>(), c.data<float>() + c.numel());
  }
  return out;
}

Status load_flat(nn::Module& module, std::span<const float> flat) {
  if (static_cast<int64_t>(flat.size()) != module.num_parameters()) {
    return invalid_argument("flat vector of " + std::to_string(flat.size()) + " for a model of " +
                            std::to_string(module.num_parameters()) + " parameters");
  }
  size_t at = 0;
  for (auto& t : module.parameters()) {
    std::memcpy(t.data<float>(), flat.data() + at, t.nbytes());
    at += static_cast<size_t>(t.numel());
  }
  return ok_status();
}

}  // namespace starling::edge_client
