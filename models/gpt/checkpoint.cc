// Checkpoint metadata layout: format, config (TOML), tokenizer, tokenizer.vocab (hex, char
// tokenizers) or tokenizer.encoder_json + tokenizer.merges (BPE), iter, train_loss, val_loss.
#include "models/gpt/checkpoint.h"

#include <spdlog/spdlog.h>

#include <cstdio>

#include "core/config/toml_config.h"
#include "core/data/bpe_tokenizer.h"
#include "core/data/char_tokenizer.h"
#include "core/data/data_dir.h"
#include "core/data/text_file.h"
#include "core/io/safetensors.h"
#include "models/gpt/lora.h"

namespace starling::models {

namespace {
constexpr const char* kFormat = "starling.gpt.v1";
}  // namespace

std::string hex_encode(const std::string& s) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

Result<std::string> hex_decode(const std::string& h) {
  if (h.size() % 2 != 0) return data_loss("odd-length hex");
  std::string out;
  for (size_t i = 0; i < h.size(); i += 2) {
    unsigned v = 0;
    if (std::sscanf(h.c_str() + i, "%2x", &v) != 1) return data_loss("bad hex digit");
    out += static_cast<char>(v);
  }
  return out;
}

Result<std::unique_ptr<data::Tokenizer>> make_tokenizer(const v1::DataConfig& d,
                                                        const std::string& corpus,
                                                        const std::filesystem::path& data_dir) {
  if (d.tokenizer() == v1::DataConfig::GPT2) {
    ASSIGN_OR_RETURN(auto bpe, data::BpeTokenizer::load_gpt2(data_dir));
    return std::unique_ptr<data::Tokenizer>(std::make_unique<data::BpeTokenizer>(std::move(bpe)));
  }
  ASSIGN_OR_RETURN(auto ct, data::CharTokenizer::from_corpus(corpus));
  return std::unique_ptr<data::Tokenizer>(std::make_unique<data::CharTokenizer>(std::move(ct)));
}

Status save_gpt_checkpoint(const std::filesystem::path& path, const Gpt& model,
                           const v1::RunConfig& config, const data::Tokenizer& tokenizer,
                           const GptCheckpointInfo& info) {
  std::map<std::string, std::string> meta;
  meta["format"] = kFormat;
  meta["config"] = config::to_toml(config);
  meta["tokenizer"] = tokenizer.name();
  if (const auto* ct = dynamic_cast<const data::CharTokenizer*>(&tokenizer)) {
    meta["tokenizer.vocab"] = hex_encode(ct->vocab());
  } else if (const auto* bpe = dynamic_cast<const data::BpeTokenizer*>(&tokenizer)) {
    // The BPE files travel with the weights: a model imported with its own vocabulary (or
    // GPT-2's) samples and resumes without the data directory.
    meta["tokenizer.encoder_json"] = bpe->encoder_json();
    meta["tokenizer.merges"] = bpe->merges();
  }
  meta["iter"] = std::to_string(info.iter);
  meta["train_loss"] = std::to_string(info.train_loss);
  meta["val_loss"] = std::to_string(info.val_loss);
  // LoRA adapters are folded in: the checkpoint is a plain GPT of the config.
  return io::save_safetensors(path, merged_state_dict(model), meta);
}

Result<LoadedGpt> load_gpt_checkpoint(const std::filesystem::path& path,
                                      const std::string& data_dir_override) {
  const std::string where = "checkpoint " + path.string();
  ASSIGN_OR_RETURN(io::SafetensorsFile file, io::load_safetensors(path));
  auto get = [&](const std::string& key) -> Result<std::string> {
    auto it = file.metadata.find(key);
    if (it == file.metadata.end()) {
      return data_loss(where + ": metadata has no '" + key + "' (not a starling GPT checkpoint?)");
    }
    return it->second;
  };
  ASSIGN_OR_RETURN(std::string format, get("format"));
  if (format != kFormat) {
    return invalid_argument(where + ": format '" + format + "', expected '" + kFormat + "'");
  }
  LoadedGpt out;
  ASSIGN_OR_RETURN(std::string toml, get("config"));
  RETURN_IF_ERROR(config::parse_toml(toml, where + " [config]", &out.config));
  ASSIGN_OR_RETURN(std::string tok, get("tokenizer"));
  if (tok == "char") {
    ASSIGN_OR_RETURN(std::string hex, get("tokenizer.vocab"));
    auto vocab = hex_decode(hex);
    if (!vocab.ok())
      return data_loss(where + ": metadata 'tokenizer.vocab': " + vocab.status().message());
    ASSIGN_OR_RETURN(auto ct, data::CharTokenizer::from_vocab(*vocab), where);
    out.tokenizer = std::make_unique<data::CharTokenizer>(std::move(ct));
  } else if (file.metadata.contains("tokenizer.encoder_json")) {
    ASSIGN_OR_RETURN(std::string merges, get("tokenizer.merges"));
    ASSIGN_OR_RETURN(auto bpe, data::BpeTokenizer::from_text(
                                   file.metadata["tokenizer.encoder_json"], std::move(merges),
                                   where + " metadata 'tokenizer.encoder_json'",
                                   where + " metadata 'tokenizer.merges'"));
    out.tokenizer = std::make_unique<data::BpeTokenizer>(std::move(bpe));
  } else {
    const std::string dd =
        data_dir_override.empty() ? out.config.data().data_dir() : data_dir_override;
    ASSIGN_OR_RETURN(auto data_dir, data::resolve_data_dir(dd));
    ASSIGN_OR_RETURN(auto bpe, data::BpeTokenizer::load_gpt2(data_dir), where);
    out.tokenizer = std::make_unique<data::BpeTokenizer>(std::move(bpe));
  }
  GptConfig gc = GptConfig::from_proto(out.config.model(), out.tokenizer->vocab_size());
  RETURN_IF_ERROR(gc.validate(), where);
  out.model = std::make_unique<Gpt>(gc, out.config.train().seed());
  RETURN_IF_ERROR(out.model->load(file.tensors), where);
  auto num = [&](const std::string& key) {
    auto it = file.metadata.find(key);
    return it == file.metadata.end() ? 0.0 : std::atof(it->second.c_str());
  };
  out.info.iter = static_cast<int64_t>(num("iter"));
  out.info.train_loss = num("train_loss");
  out.info.val_loss = num("val_loss");
  return out;
}

Result<TextData> load_text_data(const v1::RunConfig& cfg, const std::string& config_source,
                                std::shared_ptr<const data::Tokenizer> given) {
  ASSIGN_OR_RETURN(auto data_dir, data::resolve_data_dir(cfg.data().data_dir()),
                   config_source + ": data.data_dir");
  std::filesystem::path path;
  if (!cfg.data().path().empty()) {
    path = cfg.data().path();
  } else {
    ASSIGN_OR_RETURN(path, data::resolve_dataset_file(data_dir, cfg.data().dataset()),
                     config_source + ": data.dataset");
  }
  ASSIGN_OR_RETURN(std::string text, data::read_text_file(path), config_source + ": data");
  std::shared_ptr<const data::Tokenizer> tokenizer = std::move(given);
  if (!tokenizer) {
    ASSIGN_OR_RETURN(tokenizer, make_tokenizer(cfg.data(), text, data_dir));
  }
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer->encode(text), path.string());
  ASSIGN_OR_RETURN(data::TextDataset ds,
                   data::TextDataset::from_tokens(std::move(ids), cfg.data().val_fraction()));
  spdlog::info("data: {} ({} tokens: {} train, {} val), tokenizer {} (V={})", path.string(),
               ds.train_size() + ds.val_size(), ds.train_size(), ds.val_size(), tokenizer->name(),
               tokenizer->vocab_size());
  return TextData{std::move(path), std::move(tokenizer), std::move(ds)};
}

}  // namespace starling::models
