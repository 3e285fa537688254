// Error feedback on an external residual, and the residual store of idle clients.
#include "sim/client_state.h"

#include <cstdio>
#include <memory>

namespace starling::sim {

Result<ClientCodec> ClientCodec::create(std::string_view spec, const compress::Layout& layout,
                                        uint64_t seed) {
  ASSIGN_OR_RETURN(compress::CompressionSpec cs, compress::parse_compression_spec(spec),
                   "codec '" + std::string(spec) + "'");
  ClientCodec c;
  c.mask_.resize(layout.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    c.mask_[t] = cs.spec_for(layout[t].name).error_feedback ? 1 : 0;
    c.any_ef_ = c.any_ef_ || c.mask_[t];
  }
  // The same per-tensor encoders (make_codec forks one stream per tensor whatever ef says),
  // without the ErrorFeedback wrapper: the residual is ours.
  cs.default_spec.error_feedback = false;
  for (auto& o : cs.overrides) o.spec.error_feedback = false;
  ASSIGN_OR_RETURN(c.inner_, compress::make_codec(cs, layout, seed));
  return c;
}

Status ClientCodec::encode(std::span<const float> delta, std::vector<float>& residual,
                           compress::EncodedUpdate& out) {
  if (!any_ef_) return inner_->encode_into(delta, out);
  const size_t n = delta.size();
  if (!residual.empty() && residual.size() != n) {
    return invalid_argument("residual of " + std::to_string(residual.size()) +
                            " values for a delta of " + std::to_string(n));
  }
  corrected_.resize(n);
  for (size_t i = 0; i < n; ++i)
    corrected_[i] = residual.empty() ? delta[i] : delta[i] + residual[i];
  RETURN_IF_ERROR(inner_->encode_into(corrected_, out));
  sent_.assign(n, 0.0f);
  RETURN_IF_ERROR(compress::decode(out, sent_));
  residual.assign(n, 0.0f);
  for (size_t t = 0; t < mask_.size(); ++t) {
    if (!mask_[t]) continue;
    const auto& info = inner_->layout()[t];
    const auto begin = static_cast<size_t>(info.offset);
    const auto end = begin + static_cast<size_t>(shape_numel(info.shape));
    for (size_t i = begin; i < end; ++i) residual[i] = corrected_[i] - sent_[i];
  }
  return ok_status();
}

ResidualStore::~ResidualStore() {
  std::error_code ec;
  for (const auto& [client, bytes] : on_disk_) std::filesystem::remove(file_of(client), ec);
}

std::filesystem::path ResidualStore::file_of(int client) const {
  return dir_ / ("client-" + std::to_string(client) + ".f32");
}

Result<std::vector<float>> ResidualStore::take(int client) {
  std::lock_guard lock(mu_);
  if (auto it = memory_.find(client); it != memory_.end()) {
    std::vector<float> r = std::move(it->second);
    stats_.memory_bytes -= r.size() * sizeof(float);
    memory_.erase(it);
    --stats_.clients;
    return r;
  }
  auto it = on_disk_.find(client);
  if (it == on_disk_.end()) return std::vector<float>();
  const auto path = file_of(client);
  std::vector<float> r(it->second / sizeof(float));
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f || std::fread(r.data(), sizeof(float), r.size(), f.get()) != r.size()) {
    return data_loss("residual of client " + std::to_string(client) + ": cannot read " +
                     path.string());
  }
  f.reset();
  std::error_code ec;
  std::filesystem::remove(path, ec);
  stats_.disk_bytes -= it->second;
  on_disk_.erase(it);
  --stats_.clients;
  return r;
}

Status ResidualStore::put(int client, std::vector<float> residual) {
  if (residual.empty()) return ok_status();
  std::lock_guard lock(mu_);
  const uint64_t bytes = residual.size() * sizeof(float);
  ++stats_.clients;
  if (stats_.memory_bytes + bytes <= budget_) {
    stats_.memory_bytes += bytes;
    stats_.peak_memory_bytes = std::max(stats_.peak_memory_bytes, stats_.memory_bytes);
    memory_[client] = std::move(residual);
    return ok_status();
  }
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  const auto path = file_of(client);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f ||
      std::fwrite(residual.data(), sizeof(float), residual.size(), f.get()) != residual.size()) {
    --stats_.clients;
    return internal_error("residual of client " + std::to_string(client) + ": cannot write " +
                          path.string());
  }
  on_disk_[client] = bytes;
  stats_.disk_bytes += bytes;
  stats_.peak_disk_bytes = std::max(stats_.peak_disk_bytes, stats_.disk_bytes);
  return ok_status();
}

ResidualStore::Stats ResidualStore::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace starling::sim
