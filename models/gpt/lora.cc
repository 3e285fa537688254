// Adapters on a GPT's blocks.
#include "models/gpt/lora.h"

#include <cmath>
#include <map>
#include <set>

#include "core/nn/transformer.h"

namespace starling::models {

namespace {

// The block's Linear called `name` (one of lora_target_names()).
nn::Linear& target_layer(nn::Block& block, const std::string& name) {
  if (name == "attn.c_attn") return *block.attn->c_attn;
  if (name == "attn.c_proj") return *block.attn->c_proj;
  if (name == "mlp.c_fc") return *block.mlp->c_fc;
  return *block.mlp->c_proj;
}

}  // namespace

const std::vector<std::string>& lora_target_names() {
  static const std::vector<std::string> kNames = {"attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                                  "mlp.c_proj"};
  return kNames;
}

Result<LoraSpec> lora_spec_from_proto(const v1::LoraConfig& c, std::string_view source) {
  const std::string at(source);
  LoraSpec s;
  s.rank = c.rank();
  s.alpha = c.alpha();
  s.dropout = c.dropout();
  s.seed = c.seed();
  if (!s.enabled()) return s;
  if (!(std::isfinite(s.alpha) && s.alpha > 0)) {
    return invalid_argument(at + ": lora.alpha must be positive, got " + std::to_string(s.alpha));
  }
  if (!(s.dropout >= 0.0 && s.dropout < 1.0)) {
    return invalid_argument(at + ": lora.dropout must be in [0, 1), got " +
                            std::to_string(s.dropout));
  }
  std::set<std::string> seen;
  for (const auto& t : c.targets()) {
    bool known = false;
    for (const auto& n : lora_target_names()) known = known || n == t;
    if (!known) {
      std::string list;
      for (const auto& n : lora_target_names()) list += (list.empty() ? "\"" : ", \"") + n + "\"";
      return invalid_argument(at + ": lora.targets: unknown layer \"" + t + "\" (a GPT block has " +
                              list + ")");
    }
    if (!seen.insert(t).second) {
      return invalid_argument(at + ": lora.targets names \"" + t + "\" twice");
    }
  }
  for (const auto& n : lora_target_names()) {
    if (c.targets().empty() || seen.count(n)) s.targets.push_back(n);
  }
  return s;
}

void apply_lora(Gpt& model, const LoraSpec& spec) {
  model.freeze();
  Rng init(spec.seed);
  for (const auto& block : model.transformer->h->blocks()) {
    for (const auto& name : spec.targets) {
      target_layer(*block, name)
          .add_lora(spec.rank, spec.alpha, spec.dropout, init, model.dropout_rng());
    }
  }
}

Result<std::unique_ptr<Gpt>> make_gpt(const GptConfig& config, uint64_t seed, const Gpt* base,
                                      const LoraSpec& lora) {
  auto m = std::make_unique<Gpt>(config, seed);
  if (base) {
    std::map<std::string, Tensor> from;
    for (const auto& [name, t] : base->named_parameters()) from.emplace(name, t);
    for (auto& [name, t] : m->named_parameters()) {
      const auto it = from.find(name);
      if (it == from.end() || it->second.shape() != t.shape() || it->second.dtype() != t.dtype()) {
        return invalid_argument("the pretrained model has no tensor '" + name +
                                "' of the configured shape");
      }
      if (lora.enabled()) {
        const auto& src = it->second.impl();
        t.impl()->storage = src->storage;
        t.impl()->offset = src->offset;
        t.impl()->strides = src->strides;
      } else {
        t.copy_from(it->second);
      }
    }
  }
  if (lora.enabled()) apply_lora(*m, lora);
  return m;
}

v1::ModelConfig model_proto(const GptConfig& c) {
  v1::ModelConfig m;
  m.set_arch(v1::ModelConfig::GPT);
  m.set_vocab_size(static_cast<int32_t>(c.vocab_size));
  m.set_block_size(static_cast<int32_t>(c.block_size));
  m.set_n_layer(static_cast<int32_t>(c.n_layer));
  m.set_n_head(static_cast<int32_t>(c.n_head));
  m.set_n_embd(static_cast<int32_t>(c.n_embd));
  m.set_dropout(static_cast<float>(c.dropout));
  m.set_bias(c.bias);
  m.set_causal(c.causal);
  m.set_pos_encoding(c.rope ? v1::ModelConfig::ROPE : v1::ModelConfig::LEARNED);
  m.set_rope_base(static_cast<float>(c.rope_base));
  m.set_activation(c.gelu_tanh ? v1::ModelConfig::GELU_TANH : v1::ModelConfig::GELU);
  return m;
}

bool has_lora(const Gpt& model) {
  for (const auto& block : model.transformer->h->blocks()) {
    for (const auto& name : lora_target_names()) {
      if (target_layer(*block, name).has_lora()) return true;
    }
  }
  return false;
}

io::StateDict merged_state_dict(const Gpt& model) {
  io::StateDict out;
  io::StateDict replacements;
  const auto& blocks = model.transformer->h->blocks();
  for (size_t l = 0; l < blocks.size(); ++l) {
    for (const auto& name : lora_target_names()) {
      const nn::Linear& layer = target_layer(*blocks[l], name);
      if (!layer.has_lora()) continue;
      replacements.emplace_back("transformer.h." + std::to_string(l) + "." + name + ".weight",
                                layer.merged_weight());
    }
  }
  for (auto& [name, t] : model.state_dict()) {
    if (name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos) {
      continue;
    }
    Tensor value = t;
    for (const auto& [rname, r] : replacements) {
      if (rname == name) value = r;
    }
    out.emplace_back(name, value);
  }
  return out;
}

}  // namespace starling::models
