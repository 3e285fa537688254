// DDPM checkpoints: a safetensors file with the U-Net weights (and their EMA copy under
// "ema.") and, in its metadata, the run's effective TOML config (format "starling.ddpm.v1").
#pragma once

#include <filesystem>
#include <memory>

#include "core/wire/config.pb.h"
#include "models/ddpm/ddpm.h"

namespace starling::models {

struct DdpmCheckpointInfo {
  int64_t iter = 0;
  double train_loss = 0.0;  // epsilon MSE
  double val_loss = 0.0;
};

// Writes weights + metadata atomically to `path`.
Status save_ddpm_checkpoint(const std::filesystem::path& path, const Ddpm& model,
                            const v1::RunConfig& config, const DdpmCheckpointInfo& info);

struct LoadedDdpm {
  v1::RunConfig config;
  std::unique_ptr<Ddpm> model;
  DdpmCheckpointInfo info;
};

// Loads a checkpoint written by save_ddpm_checkpoint. A missing or corrupt file, another format,
// missing metadata, an invalid [ddpm] section or weights that do not fit it each give one error
// naming the file.
Result<LoadedDdpm> load_ddpm_checkpoint(const std::filesystem::path& path);

// Whether the safetensors metadata `format` names a DDPM checkpoint.
bool is_ddpm_format(const std::string& format);

}  // namespace starling::models
