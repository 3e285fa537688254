#include "sim/task_device.h"

#include <fmt/format.h>

#include <algorithm>

#include "edge_client/model_params.h"

namespace starling::sim {

TaskDevice::TaskDevice(const v1::FederationConfig& config, TaskUse use)
    : use_(use), spread_(use == TaskUse::kSimulation) {
  if (config.client().device() != "cuda") return;
  fused_ = edge_client::FusedDevice{true, {}, 1};
  for (uint32_t g : config.client().gpus()) fused_->gpus.push_back(static_cast<int>(g));
}

edge_client::FusedDevice TaskDevice::of(int client) const {
  edge_client::FusedDevice d = *fused_;
  if (spread_ && d.gpus.size() > 1) {
    d.gpus = {d.gpus[static_cast<size_t>(client) % d.gpus.size()]};
  }
  return d;
}

std::vector<edge_client::FusedDevice> TaskDevice::to_check() const {
  if (!fused_) return {};
  const size_t n = spread_ ? std::max<size_t>(1, fused_->gpus.size()) : 1;
  std::vector<edge_client::FusedDevice> out;
  for (size_t k = 0; k < n; ++k) out.push_back(of(static_cast<int>(k)));
  return out;
}

std::string TaskDevice::gpu_list() const {
  std::string ids;
  for (size_t i = 0; i < fused_->gpus.size(); ++i) {
    ids += (i ? "," : "") + std::to_string(fused_->gpus[i]);
  }
  return ids.empty() ? "0" : ids;
}

std::string TaskDevice::describe() const {
  if (!fused_) return "";
  const std::string ids = gpu_list();
  const size_t n = fused_->gpus.size();
  if (n <= 1) return fmt::format(", clients train on cuda:{} (fused engine)", ids);
  if (use_ == TaskUse::kServer) {
    return fmt::format(", clients train on cuda:{} (fused engine, each data parallel)", ids);
  }
  if (spread_) {
    return fmt::format(
        ", clients train on cuda:{} (fused engine: virtual client k on GPU k mod {})", ids, n);
  }
  return fmt::format(", trains on cuda:{} (fused engine, data parallel)", ids);
}

Device TaskDevice::image_device(int client) const {
  return fused_ ? Device::cuda(of(client).gpu(0)) : Device::cpu();
}

Status TaskDevice::check_image(std::string_view source) const {
  if (!fused_) return ok_status();
  const std::string key = std::string(source) + ": key 'client.device' = \"cuda\"";
  if (use_ == TaskUse::kClient && fused_->gpus.size() > 1) {
    return invalid_argument(std::string(source) +
                            ": key 'client.gpus': an image model's client trains on one GPU "
                            "(data parallel over several GPUs trains GPT)");
  }
  for (const auto& d : to_check()) {
    RETURN_IF_ERROR(edge_client::prepare_device(Device::cuda(d.gpu(0))), key);
  }
  return ok_status();
}

std::string TaskDevice::describe_image() const {
  if (!fused_) return "";
  const size_t n = fused_->gpus.size();
  return n > 1 ? fmt::format(", clients train on cuda:{} (client k on GPU k mod {})", gpu_list(), n)
               : fmt::format(", clients train on cuda:{}", gpu_list());
}

Result<Device> image_client_device(const v1::FederationConfig& config, std::string_view source) {
  const TaskDevice d(config, TaskUse::kClient);
  RETURN_IF_ERROR(d.check_image(source));
  return d.image_device(0);
}

}  // namespace starling::sim
