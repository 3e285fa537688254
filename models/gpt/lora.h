// LoRA on a GPT ([lora] of a run or a federation): adapters on the chosen projections of every
// block, the base frozen; the adapted model's state with the adapters folded in, for
// checkpoints and export.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/io/state_dict.h"
#include "core/util/status.h"
#include "core/wire/config.pb.h"
#include "models/gpt/gpt.h"

namespace starling::models {

struct LoraSpec {
  int64_t rank = 0;  // 0: no adapters
  double alpha = 16.0;
  double dropout = 0.0;
  // Among "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj".
  std::vector<std::string> targets;
  uint64_t seed = 7;

  bool enabled() const { return rank > 0; }
};

// The names [lora] targets accepts, in block order.
const std::vector<std::string>& lora_target_names();

// [lora] checked: rank, alpha > 0, dropout in [0, 1), known and distinct targets (empty: all
// four). Errors name `source` and the key (an unknown target lists the known ones).
Result<LoraSpec> lora_spec_from_proto(const v1::LoraConfig& c, std::string_view source);

// Freezes every weight of `model` and adds an adapter to each target of every block (A drawn
// from Rng(spec.seed), the same on every node). REQUIRES: spec.enabled(), no adapters yet.
void apply_lora(Gpt& model, const LoraSpec& spec);

// A GPT of `config` to train: weights drawn from `seed`, or those of `base` (same shape) when
// given. With `lora` enabled the base's weights are not copied: the model's frozen weights share
// the base's storage (the storage lives as long as either; nothing writes a frozen weight), then
// the adapters are added. InvalidArgument naming the tensor when `base` has another shape.
Result<std::unique_ptr<Gpt>> make_gpt(const GptConfig& config, uint64_t seed, const Gpt* base,
                                      const LoraSpec& lora);

// [model] keys of `c` (what a checkpoint's config stores to rebuild the model).
v1::ModelConfig model_proto(const GptConfig& c);

// Whether any layer of `model` has an adapter.
bool has_lora(const Gpt& model);

// The model's state dict under its plain names, each adapted weight replaced by W + s B A: what
// a checkpoint of the adapted model holds (it loads into a plain Gpt of the same config).
// Without adapters: state_dict().
io::StateDict merged_state_dict(const Gpt& model);

}  // namespace starling::models
