// MDLM checkpoints: a safetensors file with the weights and, in its metadata, the run's effective
// TOML config and the tokenizer (format "starling.mdlm.v1"), like the GPT's.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "core/data/tokenizer.h"
#include "core/wire/config.pb.h"
#include "models/mdlm/mdlm.h"

namespace starling::models {

struct MdlmCheckpointInfo {
  int64_t iter = 0;
  double train_loss = 0.0;  // NELBO, nats per token
  double val_loss = 0.0;
};

// Writes weights + metadata atomically to `path`.
Status save_mdlm_checkpoint(const std::filesystem::path& path, const Mdlm& model,
                            const v1::RunConfig& config, const data::Tokenizer& tokenizer,
                            const MdlmCheckpointInfo& info);

struct LoadedMdlm {
  v1::RunConfig config;
  std::unique_ptr<data::Tokenizer> tokenizer;
  std::unique_ptr<Mdlm> model;
  MdlmCheckpointInfo info;
};

// Loads a checkpoint written by save_mdlm_checkpoint. A missing or corrupt file, another format,
// missing metadata or weights that do not fit the config each give one error naming the file.
// `data_dir_override` is used only for the GPT-2 tokenizer files.
Result<LoadedMdlm> load_mdlm_checkpoint(const std::filesystem::path& path,
                                        const std::string& data_dir_override = "");

}  // namespace starling::models
