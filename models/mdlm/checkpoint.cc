// Metadata layout: format, config (TOML), tokenizer, tokenizer.vocab (hex), iter, train_loss,
// val_loss (the GPT's layout under another format name).
#include "models/mdlm/checkpoint.h"

#include <cstdio>
#include <cstdlib>
#include <map>

#include "core/config/toml_config.h"
#include "core/data/bpe_tokenizer.h"
#include "core/data/char_tokenizer.h"
#include "core/data/data_dir.h"
#include "core/io/safetensors.h"
#include "models/gpt/checkpoint.h"

namespace starling::models {

namespace {
constexpr const char* kFormat = "starling.mdlm.v1";
}  // namespace

Status save_mdlm_checkpoint(const std::filesystem::path& path, const Mdlm& model,
                            const v1::RunConfig& config, const data::Tokenizer& tokenizer,
                            const MdlmCheckpointInfo& info) {
  std::map<std::string, std::string> meta;
  meta["format"] = kFormat;
  meta["config"] = config::to_toml(config);
  meta["tokenizer"] = tokenizer.name();
  if (const auto* ct = dynamic_cast<const data::CharTokenizer*>(&tokenizer)) {
    meta["tokenizer.vocab"] = hex_encode(ct->vocab());
  }
  meta["iter"] = std::to_string(info.iter);
  meta["train_loss"] = std::to_string(info.train_loss);
  meta["val_loss"] = std::to_string(info.val_loss);
  return io::save_safetensors(path, model.state_dict(), meta);
}

Result<LoadedMdlm> load_mdlm_checkpoint(const std::filesystem::path& path,
                                        const std::string& data_dir_override) {
  const std::string where = "checkpoint " + path.string();
  auto file = io::load_safetensors(path);
  if (!file.ok()) return file.status().with_context(where);
  auto get = [&](const std::string& key) -> Result<std::string> {
    auto it = file->metadata.find(key);
    if (it == file->metadata.end()) {
      return data_loss(where + ": metadata has no '" + key + "' (not a starling MDLM checkpoint?)");
    }
    return it->second;
  };
  ASSIGN_OR_RETURN(std::string format, get("format"));
  if (format != kFormat) {
    return invalid_argument(where + ": format '" + format + "', expected '" + kFormat + "'");
  }
  LoadedMdlm out;
  ASSIGN_OR_RETURN(std::string toml, get("config"));
  RETURN_IF_ERROR(config::parse_toml(toml, where + " [config]", &out.config));
  ASSIGN_OR_RETURN(std::string tok, get("tokenizer"));
  if (tok == "char") {
    ASSIGN_OR_RETURN(std::string hex, get("tokenizer.vocab"));
    auto vocab = hex_decode(hex);
    if (!vocab.ok()) {
      return data_loss(where + ": metadata 'tokenizer.vocab': " + vocab.status().message());
    }
    ASSIGN_OR_RETURN(auto ct, data::CharTokenizer::from_vocab(*vocab), where);
    out.tokenizer = std::make_unique<data::CharTokenizer>(std::move(ct));
  } else {
    const std::string dd =
        data_dir_override.empty() ? out.config.data().data_dir() : data_dir_override;
    ASSIGN_OR_RETURN(auto data_dir, data::resolve_data_dir(dd));
    ASSIGN_OR_RETURN(auto bpe, data::BpeTokenizer::load_gpt2(data_dir), where);
    out.tokenizer = std::make_unique<data::BpeTokenizer>(std::move(bpe));
  }
  const MdlmConfig mc = MdlmConfig::from_proto(out.config, out.tokenizer->vocab_size());
  RETURN_IF_ERROR(mc.validate(), where);
  out.model = std::make_unique<Mdlm>(mc, out.config.train().seed());
  RETURN_IF_ERROR(out.model->load(file->tensors), where);
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
