// GPT forward pass, loss, sampling and checkpoint-compatible loading.
#include "models/gpt/gpt.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

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

Gpt::Gpt(const GptConfig& c, uint64_t seed) : config_(c), dropout_rng_(Rng(seed).fork(1)) {
  Rng init(seed);
  transformer = register_module("transformer", std::make_shared<GptTrunk>(c, init, dropout_rng_));
}

Tensor Gpt::forward(const Tensor& idx) const {
  Tensor x = transformer->embed(idx);
  x = ops::dropout(x, config_.dropout, training(), const_cast<Rng&>(dropout_rng_));
  for (const auto& block : transformer->h->blocks()) x = block->forward(x);
  x = transformer->ln_f->forward(x);
  return ops::linear(x, transformer->wte->weight);  // tied head: (B, T, V)
}

Tensor Gpt::loss(const Tensor& idx, const Tensor& targets) const {
  const Tensor logits = forward(idx);
  const int64_t v = config_.vocab_size;
  return ops::cross_entropy(ops::reshape(logits, {-1, v}), targets.reshape({-1}));
}

std::vector<int32_t> Gpt::generate(std::vector<int32_t> tokens, int64_t max_new, double temperature,
                                   int64_t top_k, Rng& rng) {
  autograd::NoGradGuard ng;
  const bool was_training = training();
  train(false);
  const int64_t v = config_.vocab_size;
  std::vector<double> probs(static_cast<size_t>(v));
  for (int64_t step = 0; step < max_new; ++step) {
    const int64_t n = static_cast<int64_t>(tokens.size());
    const int64_t start = std::max<int64_t>(0, n - config_.block_size);
    std::vector<int32_t> ctx(tokens.begin() + start, tokens.end());
    const int64_t t = static_cast<int64_t>(ctx.size());
    const Tensor logits = forward(Tensor::from_vector(ctx, {1, t}));
    const float* last = logits.data<float>() + (t - 1) * v;
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < v; ++j) {
      probs[j] = static_cast<double>(last[j]) / std::max(temperature, 1e-6);
      mx = std::max(mx, probs[j]);
    }
    if (top_k > 0 && top_k < v) {
      std::vector<double> sorted(probs);
      std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(),
                       std::greater<>());
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
    int32_t next = static_cast<int32_t>(v - 1);
    for (int64_t j = 0; j < v; ++j) {
      r -= probs[j];
      if (r < 0) {
        next = static_cast<int32_t>(j);
        break;
      }
    }
    tokens.push_back(next);
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
