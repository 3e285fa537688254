// Hugging Face GPT-2 family checkpoints (GPT2LMHeadModel: gpt2, gpt2-medium, distilgpt2, ...)
// in and out of our GPT. A directory holds config.json, model.safetensors and, for the
// tokenizer, vocab.json + merges.txt. Hugging Face stores the four projections of a block as
// Conv1D weights, (in, out); ours are nn.Linear's (out, in), so they are transposed on the way
// in and out. The head is tied to the token embedding on both sides.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/data/bpe_tokenizer.h"
#include "core/util/status.h"
#include "core/wire/config.pb.h"
#include "models/gpt/gpt.h"

namespace starling::models {

struct HfGpt2 {
  // The shape read from config.json (vocab_size, block_size = n_positions, n_layer, n_head,
  // n_embd, bias, activation), as `starling train`'s [model].
  v1::ModelConfig model;
  GptConfig config;
  std::unique_ptr<Gpt> gpt;
  // From vocab.json + merges.txt; null when the directory has neither.
  std::unique_ptr<data::BpeTokenizer> tokenizer;
};

// "hf:DIR" -> DIR, or empty when `spec` does not start with "hf:".
std::string hf_dir_of(std::string_view spec);

// Reads a Hugging Face GPT-2 directory. Refused, with the file and key or tensor named: a
// config.json of another architecture (model_type other than "gpt2") or of GPT-2 options we do
// not compute (n_inner other than 4 n_embd, scale_attn_by_inverse_layer_idx, untied head,
// an activation other than gelu / gelu_new, layer_norm_epsilon other than 1e-5); a weight file
// that is missing, corrupt, lacks a tensor, holds an unknown one, or one of the wrong shape or
// dtype; a vocab.json without merges.txt (or the reverse) or whose size differs from
// vocab_size. Weights in F16 / BF16 / F64 are converted to f32.
Result<HfGpt2> load_hf_gpt2(const std::filesystem::path& dir);

// A pretrained GPT named by [model] init_from: "hf:DIR" (load_hf_gpt2; DIR as given, else under
// `data_dir`, so "hf:gpt2-124m" finds what `starling data download gpt2-124m` fetched; a
// directory without its own tokenizer takes GPT-2's from `data_dir` when the vocabulary sizes
// agree) or the path of a starling GPT checkpoint. `spec` may list alternatives separated by
// commas, "hf:gpt2-124m, runs/base/ckpt.safetensors": the first one present is loaded (one that
// is present but corrupt is an error, not skipped), so one config runs on GPT-2 124M where it
// has been downloaded and on a smaller base elsewhere. `model` holds its shape as [model] keys.
struct PretrainedGpt {
  v1::ModelConfig model;
  std::unique_ptr<Gpt> gpt;
  std::shared_ptr<const data::Tokenizer> tokenizer;
  std::string describe;  // "Hugging Face GPT-2 DIR (L=.., ...)" for logs
};
Result<PretrainedGpt> load_pretrained_gpt(std::string_view spec,
                                          const std::filesystem::path& data_dir);

// The comma-separated alternatives of an init_from value, trimmed, empty ones dropped.
std::vector<std::string> init_from_alternatives(std::string_view spec);

// The [model] shape keys a config sets next to init_from (unset: nullopt). The shape is the
// pretrained model's: a key set to something else is refused, naming it, `source` and the model;
// block_size is the training context and may be shorter than the model's positions.
struct ShapeKeys {
  std::optional<int64_t> n_layer, n_head, n_embd, vocab_size, block_size;
  std::optional<bool> rope;
};
Status check_pretrained_shape(const PretrainedGpt& pre, const ShapeKeys& keys,
                              std::string_view source);

// Writes `model` as a directory `transformers` loads with GPT2LMHeadModel.from_pretrained:
// config.json, model.safetensors (f32) and, with a BPE `tokenizer`, vocab.json, merges.txt and
// tokenizer_config.json. A model without biases gets zero biases (the same function). Creates
// `dir` when missing; files are written atomically.
// Errors: InvalidArgument for a model GPT-2 cannot express (rotary positions, bidirectional
// attention) or with LoRA adapters (merge them first); I/O errors naming the file.
Status save_hf_gpt2(const std::filesystem::path& dir, const Gpt& model,
                    const data::Tokenizer* tokenizer);

}  // namespace starling::models
