// GPT checkpoints: a safetensors file holding the weights plus, in its metadata, the run's
// effective TOML config and the tokenizer, so that `starling sample` needs nothing else.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "core/data/text_dataset.h"
#include "core/data/tokenizer.h"
#include "core/wire/config.pb.h"
#include "models/gpt/gpt.h"

namespace starling::models {

struct GptCheckpointInfo {
  int64_t iter = 0;
  double train_loss = 0.0;
  double val_loss = 0.0;
};

// Writes weights + metadata atomically to `path`.
Status save_gpt_checkpoint(const std::filesystem::path& path, const Gpt& model,
                           const v1::RunConfig& config, const data::Tokenizer& tokenizer,
                           const GptCheckpointInfo& info);

struct LoadedGpt {
  v1::RunConfig config;
  std::unique_ptr<data::Tokenizer> tokenizer;
  std::unique_ptr<Gpt> model;
  GptCheckpointInfo info;
};

// Loads a checkpoint written by save_gpt_checkpoint. A missing or corrupt file, missing
// metadata, a config that does not parse or weights that do not fit the config each give one
// error naming the file (and the key). `data_dir` is used only for the GPT-2 tokenizer files.
Result<LoadedGpt> load_gpt_checkpoint(const std::filesystem::path& path,
                                      const std::string& data_dir_override = "");

// Hex form of a char tokenizer's vocabulary in checkpoint metadata (any bytes stay valid
// UTF-8 JSON). hex_decode returns DataLoss for odd lengths or non-hex digits.
std::string hex_encode(const std::string& bytes);
Result<std::string> hex_decode(const std::string& hex);

// Builds the tokenizer named by the config: CHAR from `corpus`, GPT2 from <data_dir>/gpt2.
Result<std::unique_ptr<data::Tokenizer>> make_tokenizer(const v1::DataConfig& data,
                                                        const std::string& corpus,
                                                        const std::filesystem::path& data_dir);

// The text of [data] (data.path, else data.dataset under the data directory), tokenized and
// split into train and val: what `starling train` reads for GPT and MDLM (and --ranks). Errors
// name `config_source` and the key; logs one "data: ..." line.
struct TextData {
  std::filesystem::path path;
  std::shared_ptr<const data::Tokenizer> tokenizer;
  data::TextDataset dataset;
};
// `tokenizer`, when given, replaces the one [data] names (a pretrained model's own).
Result<TextData> load_text_data(const v1::RunConfig& config, const std::string& config_source,
                                std::shared_ptr<const data::Tokenizer> tokenizer = nullptr);

}  // namespace starling::models
