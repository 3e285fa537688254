// GPT: token + position embeddings, L pre-norm transformer blocks, a final LayerNorm and a
// head tied to the token embedding. Parameter names follow nanoGPT ("transformer.h.0.attn.
// c_attn.weight"), so checkpoints move between starling and PyTorch without renaming.
#pragma once

#include <memory>
#include <vector>

#include "core/nn/transformer.h"
#include "core/util/rng.h"
#include "core/util/status.h"

namespace starling::v1 {
class ModelConfig;
}

namespace starling::models {

struct GptConfig {
  int64_t vocab_size = 65;  // V
  int64_t block_size = 64;  // T (max context)
  int64_t n_layer = 4;      // L
  int64_t n_head = 4;       // H
  int64_t n_embd = 128;     // C
  double dropout = 0.0;
  bool bias = false;
  bool causal = true;
  // Rotary position embeddings of q and k ([model] pos_encoding = "rope"); the trunk then has
  // no wpe (positions enter only through the rotation). rope_base: RoPE frequency base.
  bool rope = false;
  double rope_base = 10000.0;
  // The MLP's GELU: exact (erf) or GPT-2's tanh approximation ([model] activation).
  bool gelu_tanh = false;

  // vocab_size comes from the proto unless it is 0, then from `tokenizer_vocab`.
  static GptConfig from_proto(const v1::ModelConfig& m, int64_t tokenizer_vocab);
  Status validate() const;
};

// Holds the ordered list of blocks h.0 ... h.{L-1}.
class BlockList : public nn::Module {
 public:
  void push_back(std::shared_ptr<nn::Block> b);
  const std::vector<std::shared_ptr<nn::Block>>& blocks() const { return blocks_; }

 private:
  std::vector<std::shared_ptr<nn::Block>> blocks_;
};

class GptTrunk : public nn::Module {
 public:
  GptTrunk(const GptConfig& c, Rng& init, Rng& dropout_rng);
  // wte(idx) (+ wpe(0..T-1) with learned positions): idx (B, T) i32 -> (B, T, C). With
  // period > 0 row t gets wpe(t % period) (the block-diffusion layout repeats its positions).
  Tensor embed(const Tensor& idx, int64_t period = 0) const;
  // Inference only: wte(idx) (+ wpe(pos0 + t)) for idx (B, n) i32 at positions [pos0, pos0 + n),
  // through every block with its layer of `cache` (nn::Block::forward_cached) and ln_f ->
  // (B, n, C). REQUIRES: cache.n_layer() == L, cache.length() + n <= cache.capacity(), and
  // pos0 + n <= block_size with learned positions.
  Tensor forward_cached(const Tensor& idx, nn::KvCache& cache, int64_t pos0, bool causal,
                        bool append) const;
  std::shared_ptr<nn::Embedding> wte;
  std::shared_ptr<nn::Embedding> wpe;  // null when the config uses RoPE
  std::shared_ptr<BlockList> h;
  std::shared_ptr<nn::LayerNorm> ln_f;
};

class Gpt : public nn::Module {
 public:
  // Weights drawn from Rng(seed); dropout masks from a separate stream of the same seed.
  Gpt(const GptConfig& c, uint64_t seed);

  const GptConfig& config() const { return config_; }

  // idx: (B, T) i32 with T <= block_size -> logits (B, T, V).
  Tensor forward(const Tensor& idx) const;
  // The trunk's output before the head: ln_f of the last block, (B, T, C).
  Tensor hidden(const Tensor& idx) const;
  // Mean cross-entropy of next-token prediction. idx, targets: (B, T) i32 -> scalar. The head
  // and the loss are one op over chunks of rows (ops::linear_cross_entropy): no (B T, V) logits.
  Tensor loss(const Tensor& idx, const Tensor& targets) const;

  // Appends max_new tokens to `prompt` (token ids), sampling with temperature and top-k
  // (top_k <= 0 keeps all). Context is cropped to block_size. Runs in eval mode, no grad.
  // With `kv_cache` the prompt is run once into a per-layer key/value cache and each new token
  // is one row; once the context passes block_size (cropping shifts every position) the steps
  // recompute the cropped context as the uncached path does, so both give the same tokens for
  // the same rng (up to float summation order deciding a draw, which the tests do not see).
  std::vector<int32_t> generate(std::vector<int32_t> prompt, int64_t max_new, double temperature,
                                int64_t top_k, Rng& rng, bool kv_cache = true);

  // Loads a state dict; accepts nanoGPT's extra tied "lm_head.weight" when it equals wte.
  Status load(const io::StateDict& sd);

  std::shared_ptr<GptTrunk> transformer;
  // The stream that draws dropout masks (LoRA adapters draw theirs from it too).
  Rng& dropout_rng() { return dropout_rng_; }

 private:
  GptConfig config_;
  Rng dropout_rng_;
};

}  // namespace starling::models
