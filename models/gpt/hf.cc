// Hugging Face GPT-2 directories: config.json keys, tensor names and Conv1D transposes.
#include "models/gpt/hf.h"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <system_error>
#include <tuple>

#include "core/data/text_file.h"
#include "core/io/file.h"
#include "core/io/safetensors.h"
#include "models/gpt/checkpoint.h"
#include "models/gpt/lora.h"

namespace starling::models {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The four projections Hugging Face stores as Conv1D, (in, out).
bool is_conv1d(std::string_view name) {
  for (const char* suffix :
       {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
    if (name.ends_with(suffix)) return true;
  }
  return false;
}

// GPT2Attention's causal-mask buffers, present in older files; not weights.
bool is_attn_buffer(std::string_view name) {
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias");
}

// A config.json value of `type` or its default (GPT2Config's) when absent or null.
template <typename T>
Result<T> config_value(const json& j, const std::string& key, T fallback,
                       const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    return invalid_argument(where + ": key '" + key + "' has the wrong type (" + it->dump() + ")");
  }
}

std::string shape_text(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

Status write_text(const fs::path& path, const std::string& text) {
  ASSIGN_OR_RETURN(io::AtomicFile f, io::AtomicFile::create(path));
  RETURN_IF_ERROR(f.append(text.data(), text.size()));
  return f.commit();
}

// Every tensor of a GPT-2 of `c`'s shape (biases included) under our names.
std::vector<std::pair<std::string, Shape>> gpt2_tensors(const GptConfig& c) {
  const int64_t C = c.n_embd;
  std::vector<std::pair<std::string, Shape>> out = {{"transformer.wte.weight", {c.vocab_size, C}},
                                                    {"transformer.wpe.weight", {c.block_size, C}}};
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    for (const auto& [name, shape] :
         std::vector<std::pair<std::string, Shape>>{{"ln_1.weight", {C}},
                                                    {"ln_1.bias", {C}},
                                                    {"attn.c_attn.weight", {3 * C, C}},
                                                    {"attn.c_attn.bias", {3 * C}},
                                                    {"attn.c_proj.weight", {C, C}},
                                                    {"attn.c_proj.bias", {C}},
                                                    {"ln_2.weight", {C}},
                                                    {"ln_2.bias", {C}},
                                                    {"mlp.c_fc.weight", {4 * C, C}},
                                                    {"mlp.c_fc.bias", {4 * C}},
                                                    {"mlp.c_proj.weight", {C, 4 * C}},
                                                    {"mlp.c_proj.bias", {C}}}) {
      out.emplace_back(p + name, shape);
    }
  }
  out.emplace_back("transformer.ln_f.weight", Shape{C});
  out.emplace_back("transformer.ln_f.bias", Shape{C});
  return out;
}

}  // namespace

std::string hf_dir_of(std::string_view spec) {
  if (!spec.starts_with("hf:")) return "";
  return std::string(spec.substr(3));
}

Result<HfGpt2> load_hf_gpt2(const fs::path& dir) {
  const fs::path config_path = dir / "config.json";
  const std::string cfg_where = config_path.string();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return not_found("Hugging Face model directory " + dir.string() + " does not exist");
  }
  ASSIGN_OR_RETURN(std::string config_text, data::read_text_file(config_path));
  json j;
  try {
    j = json::parse(config_text);
  } catch (const json::exception& e) {
    return data_loss(cfg_where + ": malformed JSON: " + e.what());
  }
  if (!j.is_object()) return data_loss(cfg_where + ": expected a JSON object");
  ASSIGN_OR_RETURN(std::string model_type,
                   config_value<std::string>(j, "model_type", "", cfg_where));
  if (model_type != "gpt2") {
    std::string archs = "?";
    if (j.contains("architectures")) archs = j["architectures"].dump();
    return invalid_argument(cfg_where + ": model_type \"" + model_type + "\" (architectures " +
                            archs +
                            ") is not the GPT-2 family; starling imports model_type "
                            "\"gpt2\" (gpt2, gpt2-medium, gpt2-large, gpt2-xl, distilgpt2)");
  }
  ASSIGN_OR_RETURN(const int64_t vocab, config_value<int64_t>(j, "vocab_size", 50257, cfg_where));
  ASSIGN_OR_RETURN(const int64_t positions,
                   config_value<int64_t>(j, "n_positions", 1024, cfg_where));
  ASSIGN_OR_RETURN(const int64_t n_embd, config_value<int64_t>(j, "n_embd", 768, cfg_where));
  ASSIGN_OR_RETURN(const int64_t n_layer, config_value<int64_t>(j, "n_layer", 12, cfg_where));
  ASSIGN_OR_RETURN(const int64_t n_head, config_value<int64_t>(j, "n_head", 12, cfg_where));
  ASSIGN_OR_RETURN(const int64_t n_inner,
                   config_value<int64_t>(j, "n_inner", 4 * n_embd, cfg_where));
  ASSIGN_OR_RETURN(const std::string act,
                   config_value<std::string>(j, "activation_function", "gelu_new", cfg_where));
  ASSIGN_OR_RETURN(const double eps,
                   config_value<double>(j, "layer_norm_epsilon", 1e-5, cfg_where));
  ASSIGN_OR_RETURN(const bool scale_attn,
                   config_value<bool>(j, "scale_attn_weights", true, cfg_where));
  ASSIGN_OR_RETURN(const bool by_layer,
                   config_value<bool>(j, "scale_attn_by_inverse_layer_idx", false, cfg_where));
  ASSIGN_OR_RETURN(const bool tied, config_value<bool>(j, "tie_word_embeddings", true, cfg_where));
  auto refuse = [&](const std::string& key, const std::string& why) {
    return invalid_argument(cfg_where + ": key '" + key + "' " + why);
  };
  if (n_inner != 4 * n_embd) {
    return refuse("n_inner",
                  fmt::format("= {}: starling's MLP is 4 n_embd = {} wide", n_inner, 4 * n_embd));
  }
  if (act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu") {
    return refuse("activation_function",
                  "= \"" + act + "\": starling computes \"gelu_new\" (tanh) and \"gelu\" (erf)");
  }
  if (std::fabs(eps - 1e-5) > 1e-12) {
    return refuse("layer_norm_epsilon", fmt::format("= {}: starling's LayerNorm uses 1e-5", eps));
  }
  if (!scale_attn) return refuse("scale_attn_weights", "= false is not supported");
  if (by_layer) return refuse("scale_attn_by_inverse_layer_idx", "= true is not supported");
  if (!tied) return refuse("tie_word_embeddings", "= false: starling's head is tied to wte");

  HfGpt2 out;
  v1::ModelConfig& m = out.model;
  m.set_arch(v1::ModelConfig::GPT);
  m.set_vocab_size(static_cast<int32_t>(vocab));
  m.set_block_size(static_cast<int32_t>(positions));
  m.set_n_layer(static_cast<int32_t>(n_layer));
  m.set_n_head(static_cast<int32_t>(n_head));
  m.set_n_embd(static_cast<int32_t>(n_embd));
  m.set_bias(true);
  m.set_causal(true);
  m.set_pos_encoding(v1::ModelConfig::LEARNED);
  m.set_activation(act == "gelu" ? v1::ModelConfig::GELU : v1::ModelConfig::GELU_TANH);
  out.config = GptConfig::from_proto(m, vocab);
  RETURN_IF_ERROR(out.config.validate(), cfg_where);

  // Tokenizer: both files or neither.
  const fs::path vocab_json = dir / "vocab.json", merges_txt = dir / "merges.txt";
  const bool has_vocab = fs::exists(vocab_json, ec), has_merges = fs::exists(merges_txt, ec);
  if (has_vocab != has_merges) {
    return invalid_argument(dir.string() + ": " + (has_vocab ? "vocab.json" : "merges.txt") +
                            " without " + (has_vocab ? "merges.txt" : "vocab.json") +
                            " (a GPT-2 tokenizer needs both)");
  }
  if (has_vocab) {
    ASSIGN_OR_RETURN(auto tok, data::BpeTokenizer::load(vocab_json, merges_txt));
    if (tok.vocab_size() > vocab) {
      return invalid_argument(vocab_json.string() + ": " + std::to_string(tok.vocab_size()) +
                              " tokens, more than config.json's vocab_size " +
                              std::to_string(vocab));
    }
    out.tokenizer = std::make_unique<data::BpeTokenizer>(std::move(tok));
  }

  // Weights.
  const fs::path weights_path = dir / "model.safetensors";
  const std::string w_where = weights_path.string();
  if (!fs::exists(weights_path, ec)) {
    if (fs::exists(dir / "model.safetensors.index.json", ec)) {
      return unimplemented(w_where +
                           " is sharded (model.safetensors.index.json); starling reads "
                           "one file: merge the shards with safetensors first");
    }
    return not_found(w_where + " does not exist" +
                     (fs::exists(dir / "pytorch_model.bin", ec)
                          ? std::string(" (the directory has pytorch_model.bin: convert it to "
                                        "safetensors with transformers' save_pretrained("
                                        "safe_serialization=True))")
                          : std::string()));
  }
  ASSIGN_OR_RETURN(io::SafetensorsFile file, io::load_safetensors(weights_path));
  out.gpt = std::make_unique<Gpt>(out.config, 0);
  std::map<std::string, Tensor> expected;
  for (const auto& [name, t] : out.gpt->named_parameters()) expected.emplace(name, t);
  io::StateDict sd;
  std::set<std::string> loaded;
  Tensor head;
  for (auto& [raw_name, t] : file.tensors) {
    if (is_attn_buffer(raw_name)) continue;
    if (raw_name == "lm_head.weight") {
      head = t;
      continue;
    }
    const std::string name =
        raw_name.starts_with("transformer.") ? raw_name : "transformer." + raw_name;
    const auto it = expected.find(name);
    if (it == expected.end()) {
      return invalid_argument(w_where + ": unexpected tensor '" + raw_name +
                              "' (not part of a GPT-2 of config.json's shape)");
    }
    if (!dtype_is_float(t.dtype())) {
      return invalid_argument(w_where + ": tensor '" + raw_name + "' has dtype " +
                              std::string(dtype_name(t.dtype())) + ", expected a float type");
    }
    Shape want = it->second.shape();
    if (is_conv1d(name)) want = {want[1], want[0]};
    if (t.shape() != want) {
      return invalid_argument(fmt::format(
          "{}: tensor '{}' has shape {}, expected {} (config.json: n_embd {}, n_layer {}, "
          "vocab_size {}, n_positions {})",
          w_where, raw_name, shape_text(t.shape()), shape_text(want), n_embd, n_layer, vocab,
          positions));
    }
    if (!loaded.insert(name).second) {
      return invalid_argument(w_where + ": tensor '" + name + "' appears twice");
    }
    Tensor value = t.to(DType::kF32);
    if (is_conv1d(name)) value = value.transpose(0, 1).contiguous();
    sd.emplace_back(name, std::move(value));
  }
  for (const auto& [name, t] : expected) {
    if (!loaded.count(name)) {
      return invalid_argument(w_where + ": missing tensor '" + name.substr(12) + "' (as '" + name +
                              "')");
    }
  }
  RETURN_IF_ERROR(out.gpt->load_state_dict(sd, true), w_where);
  if (head.defined()) {
    // An untied head cannot be represented; a saved copy of the tied one is fine.
    const Tensor wte = out.gpt->transformer->wte->weight;
    const auto a = head.to(DType::kF32).to_float_vector();
    const auto b = wte.to_float_vector();
    if (head.shape() != wte.shape() || a != b) {
      return invalid_argument(w_where +
                              ": tensor 'lm_head.weight' differs from "
                              "'transformer.wte.weight' (an untied head; starling's is tied)");
    }
  }
  return out;
}

namespace {

// One alternative of an init_from list, trimmed.
std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Where an "hf:" alternative's directory is: DIR as given, else DIR under the data directory
// (where `starling data download gpt2-124m` puts it). Empty when neither exists.
fs::path find_hf_dir(const std::string& dir, const fs::path& data_dir) {
  std::error_code ec;
  if (fs::is_directory(dir, ec)) return dir;
  const fs::path p(dir);
  if (p.is_relative() && !data_dir.empty() && fs::is_directory(data_dir / p, ec)) {
    return data_dir / p;
  }
  return {};
}

Result<PretrainedGpt> load_one(std::string_view spec, const fs::path& data_dir) {
  PretrainedGpt out;
  const std::string hf = hf_dir_of(spec);
  if (!hf.empty()) {
    const fs::path dir = find_hf_dir(hf, data_dir);
    if (dir.empty()) {
      std::string msg = "Hugging Face model directory " + hf + " does not exist";
      if (fs::path(hf).is_relative()) msg += " (nor under the data dir " + data_dir.string() + ")";
      if (hf == "gpt2-124m") msg += "; `starling data download gpt2-124m` fetches it (549 MB)";
      return not_found(msg);
    }
    ASSIGN_OR_RETURN(HfGpt2 m, load_hf_gpt2(dir));
    out.model = m.model;
    out.gpt = std::move(m.gpt);
    if (m.tokenizer) {
      out.tokenizer = std::move(m.tokenizer);
    } else {
      ASSIGN_OR_RETURN(auto bpe, data::BpeTokenizer::load_gpt2(data_dir),
                       dir.string() +
                           " has no vocab.json / merges.txt; GPT-2's from the data "
                           "directory");
      if (bpe.vocab_size() > m.config.vocab_size) {
        return invalid_argument(dir.string() + " has no vocab.json / merges.txt, and GPT-2's " +
                                std::to_string(bpe.vocab_size()) +
                                " tokens do not fit its vocab_size " +
                                std::to_string(m.config.vocab_size));
      }
      out.tokenizer = std::make_shared<data::BpeTokenizer>(std::move(bpe));
    }
    out.describe = "Hugging Face GPT-2 " + dir.string();
  } else {
    ASSIGN_OR_RETURN(LoadedGpt c, load_gpt_checkpoint(std::string(spec), data_dir.string()));
    out.model = c.config.model();
    out.model.set_vocab_size(static_cast<int32_t>(c.model->config().vocab_size));
    out.gpt = std::move(c.model);
    out.tokenizer = std::move(c.tokenizer);
    out.describe = "checkpoint " + std::string(spec);
  }
  const GptConfig& g = out.gpt->config();
  out.describe += fmt::format(" (L={} H={} C={} T={} V={}, {} parameters)", g.n_layer, g.n_head,
                              g.n_embd, g.block_size, g.vocab_size, out.gpt->num_parameters());
  return out;
}

}  // namespace

std::vector<std::string> init_from_alternatives(std::string_view spec) {
  std::vector<std::string> out;
  while (true) {
    const size_t comma = spec.find(',');
    const std::string_view one = trim(spec.substr(0, comma));
    if (!one.empty()) out.emplace_back(one);
    if (comma == std::string_view::npos) break;
    spec.remove_prefix(comma + 1);
  }
  return out;
}

Result<PretrainedGpt> load_pretrained_gpt(std::string_view spec, const fs::path& data_dir) {
  const std::vector<std::string> alternatives = init_from_alternatives(spec);
  if (alternatives.empty()) return invalid_argument("init_from names no model");
  // The first alternative present is the base. One that is present but broken is an error, not
  // a reason to fall back: a user who put real weights first wants to hear they are corrupt.
  std::string tried;
  for (const std::string& one : alternatives) {
    const std::string hf = hf_dir_of(one);
    std::error_code ec;
    const bool present = hf.empty() ? fs::exists(one, ec) : !find_hf_dir(hf, data_dir).empty();
    if (present || alternatives.size() == 1) {
      ASSIGN_OR_RETURN(PretrainedGpt p, load_one(one, data_dir), one);
      if (alternatives.size() > 1 && !tried.empty()) {
        p.describe += " (absent:" + tried + ")";
      }
      return p;
    }
    tried += " " + one;
  }
  std::string msg = "none of the models in '" + std::string(spec) + "' is present (data dir " +
                    data_dir.string() + ")";
  for (const std::string& one : alternatives) {
    if (hf_dir_of(one) == "gpt2-124m") {
      msg += "; `starling data download gpt2-124m` fetches GPT-2 124M";
      break;
    }
  }
  return not_found(msg);
}

Status check_pretrained_shape(const PretrainedGpt& pre, const ShapeKeys& keys,
                              std::string_view source) {
  const GptConfig& g = pre.gpt->config();
  for (const auto& [name, value, want] : {std::tuple<const char*, std::optional<int64_t>, int64_t>{
                                              "n_layer", keys.n_layer, g.n_layer},
                                          {"n_head", keys.n_head, g.n_head},
                                          {"n_embd", keys.n_embd, g.n_embd},
                                          {"vocab_size", keys.vocab_size, g.vocab_size}}) {
    if (value && *value != want) {
      return invalid_argument(
          fmt::format("{}: key 'model.{}' = {}, but the pretrained model ({}) has {}; remove "
                      "the key",
                      source, name, *value, pre.describe, want));
    }
  }
  if (keys.block_size && *keys.block_size > g.block_size) {
    return invalid_argument(
        fmt::format("{}: key 'model.block_size' = {} (the training context) is longer than the "
                    "pretrained model's {} positions",
                    source, *keys.block_size, g.block_size));
  }
  if (keys.rope && *keys.rope != g.rope) {
    return invalid_argument(fmt::format(
        "{}: key 'model.pos_encoding' = \"{}\", but the pretrained model ({}) uses "
        "{} positions; remove the key",
        source, *keys.rope ? "rope" : "learned", pre.describe, g.rope ? "rotary" : "learned"));
  }
  return ok_status();
}

Status save_hf_gpt2(const fs::path& dir, const Gpt& model, const data::Tokenizer* tokenizer) {
  const GptConfig& c = model.config();
  if (c.rope) {
    return invalid_argument("export hf: the model uses rotary positions; GPT-2 has learned ones");
  }
  if (!c.causal) return invalid_argument("export hf: the model is bidirectional; GPT-2 is causal");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return permission_denied("export hf: cannot create " + dir.string() + ": " + ec.message());
  }

  json cfg = {{"architectures", {"GPT2LMHeadModel"}},
              {"model_type", "gpt2"},
              {"vocab_size", c.vocab_size},
              {"n_positions", c.block_size},
              {"n_ctx", c.block_size},
              {"n_embd", c.n_embd},
              {"n_layer", c.n_layer},
              {"n_head", c.n_head},
              {"n_inner", nullptr},
              {"activation_function", c.gelu_tanh ? "gelu_new" : "gelu"},
              {"layer_norm_epsilon", 1e-5},
              {"resid_pdrop", 0.0},
              {"embd_pdrop", 0.0},
              {"attn_pdrop", 0.0},
              {"initializer_range", 0.02},
              {"scale_attn_weights", true},
              {"scale_attn_by_inverse_layer_idx", false},
              {"reorder_and_upcast_attn", false},
              {"tie_word_embeddings", true},
              {"use_cache", true},
              {"torch_dtype", "float32"}};
  const auto* bpe = dynamic_cast<const data::BpeTokenizer*>(tokenizer);
  if (bpe && bpe->eot_id() >= 0) {
    cfg["bos_token_id"] = bpe->eot_id();
    cfg["eos_token_id"] = bpe->eot_id();
  }

  // Plain names (adapters folded in), Conv1D weights transposed, zero biases where the model
  // has none.
  io::StateDict sd;
  std::map<std::string, Tensor> have;
  for (auto& [name, t] : merged_state_dict(model)) have.emplace(name, t);
  for (const auto& [name, shape] : gpt2_tensors(c)) {
    const auto it = have.find(name);
    Tensor value =
        it != have.end() ? it->second.detach().to(DType::kF32).contiguous() : Tensor::zeros(shape);
    if (is_conv1d(name)) value = value.transpose(0, 1).contiguous();
    sd.emplace_back(name, value);
  }
  RETURN_IF_ERROR(io::save_safetensors(dir / "model.safetensors", sd, {{"format", "pt"}}));
  RETURN_IF_ERROR(write_text(dir / "config.json", cfg.dump(2) + "\n"));
  if (bpe) {
    RETURN_IF_ERROR(write_text(dir / "vocab.json", bpe->encoder_json()));
    RETURN_IF_ERROR(write_text(dir / "merges.txt", bpe->merges()));
    json tc = {{"tokenizer_class", "GPT2Tokenizer"},
               {"model_max_length", c.block_size},
               {"add_prefix_space", false}};
    if (bpe->eot_id() >= 0) {
      tc["bos_token"] = "<|endoftext|>";
      tc["eos_token"] = "<|endoftext|>";
      tc["unk_token"] = "<|endoftext|>";
    }
    RETURN_IF_ERROR(write_text(dir / "tokenizer_config.json", tc.dump(2) + "\n"));
  }
  return ok_status();
}

}  // namespace starling::models
