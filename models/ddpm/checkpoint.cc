// Metadata layout: format, config (TOML), iter, train_loss, val_loss (the GPT's layout, no
// tokenizer).
#include "models/ddpm/checkpoint.h"

#include <cstdlib>
#include <map>

#include "core/config/toml_config.h"
#include "core/io/safetensors.h"

namespace starling::models {

namespace {
constexpr const char* kFormat = "starling.ddpm.v1";
}  // namespace

bool is_ddpm_format(const std::string& format) { return format == kFormat; }

Status save_ddpm_checkpoint(const std::filesystem::path& path, const Ddpm& model,
                            const v1::RunConfig& config, const DdpmCheckpointInfo& info) {
  std::map<std::string, std::string> meta;
  meta["format"] = kFormat;
  meta["config"] = config::to_toml(config);
  meta["iter"] = std::to_string(info.iter);
  meta["train_loss"] = std::to_string(info.train_loss);
  meta["val_loss"] = std::to_string(info.val_loss);
  return io::save_safetensors(path, model.checkpoint_state(), meta);
}

Result<LoadedDdpm> load_ddpm_checkpoint(const std::filesystem::path& path) {
  const std::string where = "checkpoint " + path.string();
  auto file = io::load_safetensors(path);
  if (!file.ok()) return file.status().with_context(where);
  auto get = [&](const std::string& key) -> Result<std::string> {
    auto it = file->metadata.find(key);
    if (it == file->metadata.end()) {
      return data_loss(where + ": metadata has no '" + key + "' (not a starling DDPM checkpoint?)");
    }
    return it->second;
  };
  ASSIGN_OR_RETURN(std::string format, get("format"));
  if (format != kFormat) {
    return invalid_argument(where + ": format '" + format + "', expected '" + kFormat + "'");
  }
  LoadedDdpm out;
  ASSIGN_OR_RETURN(std::string toml, get("config"));
  RETURN_IF_ERROR(config::parse_toml(toml, where + " [config]", &out.config));
  const DdpmConfig dc = DdpmConfig::from_proto(out.config);
  RETURN_IF_ERROR(dc.validate(), where);
  out.model = std::make_unique<Ddpm>(dc, out.config.train().seed());
  RETURN_IF_ERROR(out.model->load_checkpoint_state(file->tensors), where);
  auto num = [&](const std::string& key) {
    auto it = file->metadata.find(key);
    return it == file->metadata.end() ? 0.0 : std::atof(it->second.c_str());
  };
  out.info.iter = static_cast<int64_t>(num("iter"));
  out.info.train_loss = num("train_loss");
  out.info.val_loss = num("val_loss");
  return out;
}

}  // namespace starling::models
