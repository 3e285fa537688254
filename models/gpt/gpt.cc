// GPT forward pass, loss, sampling and checkpoint-compatible loading.
#include "models/gpt/gpt.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "core/ops/internal/op_util.h"
#include "core/ops/ops.h"
#include "core/wire/config.pb.h"

namespace starling::models {

GptConfig GptConfig::from_proto(const v1::ModelConfig& m, int64_t tokenizer_vocab) {
  GptConfig c;
  c.vocab_size = m.vocab_size() > 0 ? m.vocab_size() : tokenizer_vocab;
  c.block_size = m.block_size();
  c.n_layer = m.n_layer();
  c.n_head = m.n_head();
  c.n_embd = m.n_embd();
  c.dropout = m.dropout();
  c.bias = m.bias();
  c.causal = m.causal();
  c.rope = m.pos_encoding() == v1::ModelConfig::ROPE;
  c.rope_base = m.rope_base();
  c.gelu_tanh = m.activation() == v1::ModelConfig::GELU_TANH;
  return c;
}

Status GptConfig::validate() const {
  if (vocab_size <= 0) return invalid_argument("model.vocab_size must be positive");
  if (block_size <= 0) return invalid_argument("model.block_size must be positive");
  if (n_layer <= 0 || n_head <= 0 || n_embd <= 0) {
    return invalid_argument("model.n_layer, n_head and n_embd must be positive");
  }
  if (n_embd % n_head != 0) {
    return invalid_argument("model.n_embd (" + std::to_string(n_embd) +
                            ") must be divisible by model.n_head (" + std::to_string(n_head) + ")");
  }
  if (dropout < 0.0 || dropout >= 1.0) return invalid_argument("model.dropout must be in [0, 1)");
  if (rope && (n_embd / n_head) % 2 != 0) {
    return invalid_argument(
        "model.pos_encoding = \"rope\" needs an even head size, got n_embd / n_head = " +
        std::to_string(n_embd / n_head));
  }
  if (rope && !(std::isfinite(rope_base) && rope_base > 1.0)) {
    return invalid_argument("model.rope_base must be finite and > 1");
  }
  return ok_status();
}

void BlockList::push_back(std::shared_ptr<nn::Block> b) {
  blocks_.push_back(register_module(std::to_string(blocks_.size()), std::move(b)));
}

GptTrunk::GptTrunk(const GptConfig& c, Rng& init, Rng& dropout_rng) {
  wte = register_module("wte", std::make_shared<nn::Embedding>(c.vocab_size, c.n_embd, init));
  if (!c.rope) {
    wpe = register_module("wpe", std::make_shared<nn::Embedding>(c.block_size, c.n_embd, init));
  }
  h = register_module("h", std::make_shared<BlockList>());
  nn::TransformerShape s{c.n_embd, c.n_head, c.n_layer, c.dropout, c.bias, c.causal};
  s.rope = c.rope;
  s.rope_base = c.rope_base;
  s.gelu_tanh = c.gelu_tanh;
  for (int64_t i = 0; i < c.n_layer; ++i)
    h->push_back(std::make_shared<nn::Block>(s, init, dropout_rng));
  ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(c.n_embd, c.bias));
}

Tensor GptTrunk::embed(const Tensor& idx, int64_t period) const {
  const Tensor tok = wte->forward(idx);
  if (!wpe) return tok;
  const int64_t T = idx.shape()[1];
  Tensor pos = Tensor::uninitialized({T}, DType::kI32);
  int32_t* pp = pos.data<int32_t>();
  for (int64_t t = 0; t < T; ++t) pp[t] = static_cast<int32_t>(period > 0 ? t % period : t);
  return ops::add(tok, wpe->forward(pos));
}

Tensor GptTrunk::forward_cached(const Tensor& idx, nn::KvCache& cache, int64_t pos0, bool causal,
                                bool append) const {
  const auto& blocks = h->blocks();
  STARLING_OP_CHECK(idx.dim() == 2 && cache.n_layer() == static_cast<int64_t>(blocks.size()) &&
                        cache.batch() == idx.shape()[0],
                    "gpt", "forward_cached: idx (B, n) and a cache of B rows per layer");
  const int64_t n = idx.shape()[1];
  Tensor x = wte->forward(idx);
  if (wpe) {
    STARLING_OP_CHECK(pos0 >= 0 && pos0 + n <= wpe->weight.shape()[0], "gpt",
                      "forward_cached: positions [" + std::to_string(pos0) + ", " +
                          std::to_string(pos0 + n) + ") past the learned position table");
    Tensor pos = Tensor::uninitialized({n}, DType::kI32);
    int32_t* pp = pos.data<int32_t>();
    for (int64_t t = 0; t < n; ++t) pp[t] = static_cast<int32_t>(pos0 + t);
    x = ops::add(x, wpe->forward(pos));
  }
  for (size_t l = 0; l < blocks.size(); ++l) {
    x = blocks[l]->forward_cached(x, cache.layer(static_cast<int64_t>(l)), pos0, causal, append);
  }
  return ln_f->forward(x);
}

Gpt::Gpt(const GptConfig& c, uint64_t seed) : config_(c), dropout_rng_(Rng(seed).fork(1)) {
  Rng init(seed);
  transformer = register_module("transformer", std::make_shared<GptTrunk>(c, init, dropout_rng_));
}

Tensor Gpt::hidden(const Tensor& idx) const {
  Tensor x = transformer->embed(idx);
  x = ops::dropout(x, config_.dropout, training(), const_cast<Rng&>(dropout_rng_));
  for (const auto& block : transformer->h->blocks()) x = block->forward(x);
  return transformer->ln_f->forward(x);
}

Tensor Gpt::forward(const Tensor& idx) const {
  return ops::linear(hidden(idx), transformer->wte->weight);  // tied head: (B, T, V)
}

Tensor Gpt::loss(const Tensor& idx, const Tensor& targets) const {
  // The tied head and the loss in one op: (B T, V) logits never exist whole.
  return ops::linear_cross_entropy(ops::reshape(hidden(idx), {-1, config_.n_embd}),
                                   transformer->wte->weight, targets.reshape({-1}));
}

namespace {

// Draws the next token from one row of logits (V values): temperature, then top-k, then one
// uniform of `rng` against the cumulative weights.
int32_t sample_next(const float* last, int64_t v, double temperature, int64_t top_k, Rng& rng,
                    std::vector<double>& probs) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < v; ++j) {
    probs[j] = static_cast<double>(last[j]) / std::max(temperature, 1e-6);
    mx = std::max(mx, probs[j]);
  }
  if (top_k > 0 && top_k < v) {
    std::vector<double> sorted(probs);
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<>());
    const double kth = sorted[top_k - 1];
    for (auto& p : probs) {
      if (p < kth) p = -std::numeric_limits<double>::infinity();
    }
  }
  double sum = 0.0;
  for (auto& p : probs) {
    p = std::exp(p - mx);
    sum += p;
  }
  double r = rng.uniform() * sum;
  for (int64_t j = 0; j < v; ++j) {
    r -= probs[j];
    if (r < 0) return static_cast<int32_t>(j);
  }
  return static_cast<int32_t>(v - 1);
}

}  // namespace

std::vector<int32_t> Gpt::generate(std::vector<int32_t> tokens, int64_t max_new, double temperature,
                                   int64_t top_k, Rng& rng, bool kv_cache) {
  autograd::NoGradGuard ng;
  const bool was_training = training();
  train(false);
  const int64_t v = config_.vocab_size, bs = config_.block_size;
  std::vector<double> probs(static_cast<size_t>(v));
  std::unique_ptr<nn::KvCache> cache;
  // A bidirectional GPT (causal = false) lets every row see later ones: nothing to cache.
  if (kv_cache && config_.causal && max_new > 0 && static_cast<int64_t>(tokens.size()) <= bs) {
    cache = std::make_unique<nn::KvCache>(config_.n_layer, 1, bs, config_.n_embd);
  }
  for (int64_t step = 0; step < max_new; ++step) {
    const int64_t n = static_cast<int64_t>(tokens.size());
    Tensor logits;  // the last row's: (.., V)
    if (cache && n <= bs) {
      // Positions [cache.length(), n) are new: the whole prompt first, then one token a step.
      const int64_t past = cache->length();
      std::vector<int32_t> rows(tokens.begin() + past, tokens.end());
      const int64_t m = n - past;
      const Tensor hidden = transformer->forward_cached(Tensor::from_vector(rows, {1, m}), *cache,
                                                        past, config_.causal, true);
      logits = ops::linear(ops::slice(hidden, 1, m - 1, m), transformer->wte->weight);
    } else {
      const int64_t start = std::max<int64_t>(0, n - bs);
      std::vector<int32_t> ctx(tokens.begin() + start, tokens.end());
      const int64_t t = static_cast<int64_t>(ctx.size());
      logits = ops::slice(forward(Tensor::from_vector(ctx, {1, t})), 1, t - 1, t).contiguous();
    }
    tokens.push_back(sample_next(logits.data<float>(), v, temperature, top_k, rng, probs));
  }
  train(was_training);
  return tokens;
}

Status Gpt::load(const io::StateDict& sd) {
  io::StateDict filtered;
  for (const auto& [name, t] : sd) {
    if (name == "lm_head.weight") continue;  // tied to transformer.wte.weight
    filtered.emplace_back(name, t);
  }
  return load_state_dict(filtered, true);
}

}  // namespace starling::models
