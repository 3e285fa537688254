// MDLM / UDLM forward pass, corruption, NELBO and ancestral samplers.
#include "models/mdlm/mdlm.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <string>

#include "core/ops/internal/op_util.h"
#include "core/ops/ops.h"
#include "core/wire/config.pb.h"

namespace starling::models {

namespace {

// Draws an index from unnormalized non-negative weights w (sum > 0) with one uniform.
int32_t draw(const std::vector<double>& w, Rng& rng) {
  double sum = 0.0;
  for (double x : w) sum += x;
  double r = rng.uniform() * sum;
  const auto n = static_cast<int64_t>(w.size());
  int32_t last_positive = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (w[j] <= 0.0) continue;
    last_positive = static_cast<int32_t>(j);
    r -= w[j];
    if (r < 0) return last_positive;
  }
  return last_positive;  // rounding left r >= 0
}

// Softmax of row[0..n) / temperature into out.
void softmax_row(const float* row, int64_t n, double temperature, std::vector<double>& out) {
  out.resize(static_cast<size_t>(n));
  const double inv = 1.0 / std::max(temperature, 1e-6);
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, static_cast<double>(row[j]) * inv);
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    out[j] = std::exp(static_cast<double>(row[j]) * inv - mx);
    sum += out[j];
  }
  for (auto& p : out) p /= sum;
}

}  // namespace

MdlmConfig MdlmConfig::from_proto(const v1::RunConfig& c, int64_t tokenizer_vocab) {
  MdlmConfig m;
  const auto& mc = c.model();
  m.vocab_size = mc.vocab_size() > 0 ? mc.vocab_size() : tokenizer_vocab;
  m.block_size = mc.block_size();
  m.n_layer = mc.n_layer();
  m.n_head = mc.n_head();
  m.n_embd = mc.n_embd();
  m.dropout = mc.dropout();
  m.bias = mc.bias();
  m.rope = mc.pos_encoding() == v1::ModelConfig::ROPE;
  m.rope_base = mc.rope_base();
  m.noise = c.diffusion().noise() == v1::DiffusionConfig::UNIFORM ? DiffusionNoise::kUniform
                                                                  : DiffusionNoise::kAbsorbing;
  m.eps = c.diffusion().eps();
  m.masking = c.diffusion().masking() == v1::DiffusionConfig::COUNT ? MaskSampling::kCount
                                                                    : MaskSampling::kBernoulli;
  m.block_length = c.diffusion().block_length();
  m.antithetic = c.diffusion().antithetic();
  return m;
}

Status MdlmConfig::validate() const {
  RETURN_IF_ERROR(trunk_config().validate());
  if (vocab_size < 2) return invalid_argument("model.vocab_size must be at least 2");
  if (!(eps > 0.0 && eps < 1.0)) return invalid_argument("diffusion.eps must be in (0, 1)");
  if (masking == MaskSampling::kCount && noise != DiffusionNoise::kAbsorbing) {
    return invalid_argument(
        "diffusion.masking = \"count\" needs diffusion.noise = \"absorbing\" (it draws masks)");
  }
  if (block_length < 0 || (block_length > 0 && block_size % block_length != 0)) {
    return invalid_argument(
        "diffusion.block_length = " + std::to_string(block_length) +
        " must be 0 or divide model.block_size = " + std::to_string(block_size));
  }
  if (antithetic && (masking != MaskSampling::kCount || noise != DiffusionNoise::kAbsorbing)) {
    return invalid_argument(
        "diffusion.antithetic = true needs diffusion.masking = \"count\" and absorbing noise");
  }
  if (block_diffusion() && noise != DiffusionNoise::kAbsorbing) {
    return invalid_argument("diffusion.block_length = " + std::to_string(block_length) +
                            " (block diffusion) needs diffusion.noise = \"absorbing\"");
  }
  return ok_status();
}

GptConfig MdlmConfig::trunk_config() const {
  GptConfig g;
  g.vocab_size = vocab_size + (noise == DiffusionNoise::kAbsorbing ? 1 : 0);
  g.block_size = block_size;
  g.n_layer = n_layer;
  g.n_head = n_head;
  g.n_embd = n_embd;
  g.dropout = dropout;
  g.bias = bias;
  g.causal = false;
  g.rope = rope;
  g.rope_base = rope_base;
  return g;
}

Mdlm::Mdlm(const MdlmConfig& c, uint64_t seed) : config_(c), dropout_rng_(Rng(seed).fork(1)) {
  Rng init(seed);
  transformer = register_module("transformer",
                                std::make_shared<GptTrunk>(c.trunk_config(), init, dropout_rng_));
}

Tensor Mdlm::trunk_forward(const Tensor& ids, const ops::AttnMask& mask) const {
  Tensor x = transformer->embed(ids, mask.position_period(ids.shape()[1]));
  x = ops::dropout(x, config_.dropout, training(), const_cast<Rng&>(dropout_rng_));
  for (const auto& block : transformer->h->blocks()) x = block->forward(x, mask);
  x = transformer->ln_f->forward(x);
  return ops::linear(x, transformer->wte->weight);  // tied head
}

Tensor Mdlm::data_logits(const Tensor& raw) const {
  if (config_.noise == DiffusionNoise::kUniform) return raw;
  return ops::contiguous(ops::slice(raw, 2, 0, config_.vocab_size));
}

Tensor Mdlm::forward(const Tensor& xt, const Tensor& x0) const {
  if (!config_.block_diffusion()) return data_logits(trunk_forward(xt, ops::AttnMask::full()));
  STARLING_OP_CHECK(x0.defined() && x0.shape() == xt.shape(), "mdlm",
                    "block diffusion: forward needs the clean x0 of xt's shape");
  // [xt | x0] along the sequence: 2T positions, the second half repeating the first's.
  const int64_t b = xt.shape()[0], len = xt.shape()[1];
  const Tensor xc = xt.contiguous(), x0c = x0.contiguous();
  Tensor ids = Tensor::uninitialized({b, 2 * len}, DType::kI32);
  int32_t* pi = ids.data<int32_t>();
  for (int64_t i = 0; i < b; ++i) {
    std::copy_n(xc.data<int32_t>() + i * len, len, pi + 2 * i * len);
    std::copy_n(x0c.data<int32_t>() + i * len, len, pi + (2 * i + 1) * len);
  }
  const Tensor raw =
      trunk_forward(ids, ops::AttnMask::block_diffusion(config_.block_tokens()));  // (B, 2T, V')
  return data_logits(ops::slice(raw, 1, 0, len));
}

Tensor Mdlm::prefix_forward(const Tensor& x) const {
  const ops::AttnMask mask = config_.block_diffusion()
                                 ? ops::AttnMask::block_causal(config_.block_tokens())
                                 : ops::AttnMask::full();
  return data_logits(trunk_forward(x, mask));
}

Tensor Mdlm::block_forward_cached(const Tensor& block, nn::KvCache& cache, bool append) const {
  const Tensor hidden = transformer->forward_cached(block, cache, cache.length(), false, append);
  return data_logits(ops::linear(hidden, transformer->wte->weight));
}

Tensor Mdlm::subs_logits(const Tensor& xt, const Tensor& x0) const {
  autograd::NoGradGuard ng;
  const Tensor logits = forward(xt, x0);
  if (config_.noise == DiffusionNoise::kUniform) return logits;
  const int64_t n = xt.numel(), v = config_.vocab_size;
  const float kNegInf = -std::numeric_limits<float>::infinity();
  Tensor out = Tensor::full({xt.shape()[0], xt.shape()[1], v + 1}, kNegInf);
  const Tensor xc = xt.contiguous();
  const int32_t* px = xc.data<int32_t>();
  const float* pl = logits.data<float>();
  float* po = out.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    float* row = po + i * (v + 1);
    if (px[i] == mask_id()) {
      std::copy(pl + i * v, pl + (i + 1) * v, row);
    } else {
      row[px[i]] = 0.0f;
    }
  }
  return out;
}

std::vector<double> Mdlm::sample_times(int64_t n, Rng& rng) const {
  std::vector<double> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double u = (static_cast<double>(i) + rng.uniform()) / static_cast<double>(n);
    t[i] = config_.eps + (1.0 - config_.eps) * u;
  }
  return t;
}

NoisedBatch Mdlm::corrupt(const Tensor& x0, std::span<const double> t, Rng& rng) const {
  const int64_t b = x0.shape()[0], len = x0.shape()[1], nb = config_.num_blocks();
  const int64_t bl = len / nb;
  STARLING_OP_CHECK(static_cast<int64_t>(t.size()) == b * nb, "mdlm",
                    "corrupt: one time per block");
  NoisedBatch out{x0.clone(), std::vector<double>(t.begin(), t.end())};
  int32_t* p = out.xt.data<int32_t>();
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t j = 0; j < len; ++j) {
      const double move = 1.0 - config_.alpha(t[i * nb + j / bl]);
      if (rng.uniform() >= move) continue;
      p[i * len + j] =
          config_.noise == DiffusionNoise::kAbsorbing
              ? mask_id()
              : static_cast<int32_t>(rng.below(static_cast<uint64_t>(config_.vocab_size)));
    }
  }
  return out;
}

NoisedBatch Mdlm::corrupt_count(const Tensor& x0, Rng& rng) const {
  const int64_t units = x0.shape()[0] * config_.num_blocks();
  std::vector<double> u(static_cast<size_t>(units));
  for (int64_t i = 0; i < units; ++i) {
    u[i] = (static_cast<double>(i) + rng.uniform()) / static_cast<double>(units);
  }
  return corrupt_count(x0, u, rng);
}

NoisedBatch Mdlm::corrupt_count(const Tensor& x0, std::span<const double> u, Rng& rng) const {
  const int64_t b = x0.shape()[0], len = x0.shape()[1], nb = config_.num_blocks();
  const int64_t bl = len / nb, units = b * nb;  // one unit = one diffusion block of bl tokens
  STARLING_OP_CHECK(static_cast<int64_t>(u.size()) == units, "mdlm",
                    "corrupt_count: one u per block");
  NoisedBatch out{x0.clone(), std::vector<double>(static_cast<size_t>(units))};
  int32_t* p = out.xt.data<int32_t>();
  std::vector<int64_t> perm(static_cast<size_t>(bl));
  for (int64_t i = 0; i < units; ++i) {
    const int64_t k =
        std::clamp<int64_t>(1 + static_cast<int64_t>(u[i] * static_cast<double>(bl)), 1, bl);
    out.t[i] = static_cast<double>(k) / static_cast<double>(bl);
    // The first k entries of a partial Fisher-Yates shuffle: a uniform k-subset of the block.
    std::iota(perm.begin(), perm.end(), 0);
    int32_t* unit = p + (i / nb) * len + (i % nb) * bl;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = j + static_cast<int64_t>(rng.below(static_cast<uint64_t>(bl - j)));
      std::swap(perm[j], perm[r]);
      unit[perm[j]] = mask_id();
    }
  }
  return out;
}

NoisedBatch Mdlm::antithetic_pair(const NoisedBatch& first, const Tensor& x0, Rng& rng) const {
  const int64_t b = x0.shape()[0], len = x0.shape()[1], nb = config_.num_blocks();
  const int64_t bl = len / nb, units = b * nb;
  const Tensor x0c = x0.contiguous(), z1 = first.xt.contiguous();
  const int32_t* px = x0c.data<int32_t>();
  const int32_t* pz = z1.data<int32_t>();
  NoisedBatch out{Tensor::uninitialized({2 * b, len}, DType::kI32), first.t};
  int32_t* po = out.xt.data<int32_t>();
  std::copy_n(pz, b * len, po);
  int32_t* second = po + b * len;
  std::vector<int64_t> masked;
  for (int64_t u = 0; u < units; ++u) {
    const int64_t base = (u / nb) * len + (u % nb) * bl;
    masked.clear();
    for (int64_t j = 0; j < bl; ++j) {
      const bool m = pz[base + j] == mask_id();
      if (m) masked.push_back(j);
      second[base + j] = m ? px[base + j] : mask_id();
    }
    STARLING_OP_CHECK(!masked.empty(), "mdlm",
                      "antithetic_pair: a block of the first mask is empty");
    second[base + masked[rng.below(masked.size())]] = mask_id();
    const auto k2 = static_cast<double>(bl + 1 - static_cast<int64_t>(masked.size()));
    out.t.push_back(k2 / static_cast<double>(bl));
  }
  return out;
}

Tensor Mdlm::loss(const Tensor& x0, Rng& rng) const {
  if (config_.masking == MaskSampling::kCount && config_.noise == DiffusionNoise::kAbsorbing) {
    const NoisedBatch nb = corrupt_count(x0, rng);
    if (!config_.antithetic) return loss(x0, nb.t, nb.xt);
    const NoisedBatch pair = antithetic_pair(nb, x0, rng);
    const Tensor x0c = x0.contiguous();
    std::vector<int32_t> twice(x0c.data<int32_t>(), x0c.data<int32_t>() + x0c.numel());
    twice.insert(twice.end(), twice.begin(), twice.end());
    return loss(Tensor::from_vector(twice, pair.xt.shape()), pair.t, pair.xt);
  }
  const auto t = sample_times(x0.shape()[0] * config_.num_blocks(), rng);
  const NoisedBatch nb = corrupt(x0, t, rng);
  return loss(x0, nb.t, nb.xt);
}

Tensor Mdlm::loss(const Tensor& x0, std::span<const double> t, const Tensor& xt) const {
  const int64_t b = x0.shape()[0], len = x0.shape()[1], v = config_.vocab_size;
  const double norm = 1.0 / static_cast<double>(b * len);
  const Tensor x0c = x0.contiguous(), xtc = xt.contiguous();
  const int32_t* px = x0c.data<int32_t>();
  const int32_t* pz = xtc.data<int32_t>();
  const int64_t nb = config_.num_blocks(), bl = len / nb;
  STARLING_OP_CHECK(static_cast<int64_t>(t.size()) == b * nb, "mdlm", "loss: one time per block");
  const Tensor logits = ops::reshape(forward(xt, x0), {b * len, v});

  if (config_.noise == DiffusionNoise::kAbsorbing) {
    // Each masked position: -log p(x0 | xt) weighted by 1/t of its block, over B * T.
    std::vector<int32_t> targets(static_cast<size_t>(b * len), -100);
    std::vector<double> weights(static_cast<size_t>(b * len), 0.0);
    for (int64_t k = 0; k < b * len; ++k) {
      if (pz[k] != mask_id()) continue;
      targets[k] = px[k];
      weights[k] = norm / t[(k / len) * nb + (k % len) / bl];
    }
    return ops::weighted_cross_entropy(logits, Tensor::from_vector(targets, {b * len}), weights);
  }

  // Uniform noise. Per position (x = x0, z = xt, N = V, xb_th = N alpha p + (1 - alpha)):
  //   beta/xb_th[z] + sum_y W[y] log xb_th[y] + K,   beta = -alpha'/alpha,
  //   W[y] = -(beta/N) c_y for y != z, W[z] = (beta/N) sum_{y != z} c_y,  c_y = xb[y]/xb[z],
  //   K = (beta/N) [-N/xb[z] - sum_{y != z} c_y (log xb[z] - log xb[y])].
  const double n = static_cast<double>(v);
  std::vector<float> scale(static_cast<size_t>(b)), shift(static_cast<size_t>(b));
  std::vector<float> onehot(static_cast<size_t>(b * len * v), 0.0f);
  std::vector<float> w(static_cast<size_t>(b * len * v), 0.0f);
  std::vector<float> beta_pos(static_cast<size_t>(b * len));
  double k_total = 0.0;
  for (int64_t i = 0; i < b; ++i) {
    const double a = config_.alpha(t[i]);
    const double beta = -config_.dalpha() / a;
    scale[i] = static_cast<float>(n * a);
    shift[i] = static_cast<float>(1.0 - a);
    const double hi = n * a + (1.0 - a), lo = 1.0 - a;  // xb at x0, elsewhere
    for (int64_t j = 0; j < len; ++j) {
      const int64_t k = i * len + j;
      const bool z_is_x = pz[k] == px[k];
      const double xbz = z_is_x ? hi : lo;
      // c_y over y != z: if z == x0 every other y has lo; else y == x0 has hi, the rest lo.
      const double c_lo = lo / xbz, c_hi = hi / xbz;
      const double csum = z_is_x ? (n - 1.0) * c_lo : c_hi + (n - 2.0) * c_lo;
      float* wr = w.data() + k * v;
      for (int64_t y = 0; y < v; ++y) {
        if (y == pz[k]) continue;
        const double c = y == px[k] ? c_hi : c_lo;
        wr[y] = static_cast<float>(-beta / n * c);
      }
      wr[pz[k]] = static_cast<float>(beta / n * csum);
      onehot[static_cast<size_t>(k * v + pz[k])] = 1.0f;
      beta_pos[k] = static_cast<float>(beta);
      double klog = 0.0;  // sum_{y != z} c_y (log xb[z] - log xb[y])
      if (z_is_x) {
        klog = (n - 1.0) * c_lo * (std::log(hi) - std::log(lo));
      } else {
        klog = c_hi * (std::log(lo) - std::log(hi));
      }
      k_total += beta / n * (-n / xbz - klog);
    }
  }
  const Tensor probs = ops::reshape(ops::softmax(logits), {b, len, v});
  const Tensor xb_th = ops::add(ops::mul(probs, Tensor::from_vector(scale, {b, 1, 1})),
                                Tensor::from_vector(shift, {b, 1, 1}));
  const Tensor oh = Tensor::from_vector(onehot, {b, len, v});
  const Tensor xb_z = ops::sum(ops::mul(xb_th, oh), 2, false);  // (B, T)
  const Tensor term1 = ops::sum(ops::div(Tensor::from_vector(beta_pos, {b, len}), xb_z));
  const Tensor term2 = ops::sum(ops::mul(ops::log(xb_th), Tensor::from_vector(w, {b, len, v})));
  return ops::mul_scalar(ops::add_scalar(ops::add(term1, term2), k_total), norm);
}

double udlm_integrand(int32_t x0, int32_t z, std::span<const double> probs, double alpha,
                      double dalpha) {
  const auto v = static_cast<int64_t>(probs.size());
  const double n = static_cast<double>(v);
  auto xb = [&](int64_t y) { return (y == x0 ? n * alpha : 0.0) + (1.0 - alpha); };
  auto xbt = [&](int64_t y) { return n * alpha * probs[y] + (1.0 - alpha); };
  double s = n / xbt(z) - n / xb(z);
  for (int64_t y = 0; y < v; ++y) {
    if (y == z) continue;
    s -= xb(y) / xb(z) * std::log(xbt(y) * xb(z) / (xbt(z) * xb(y)));
  }
  return -dalpha / (n * alpha) * s;
}

std::vector<int32_t> Mdlm::sample(int64_t num, int64_t steps, double temperature, bool cached,
                                  Rng& rng, SampleStats* stats, bool kv_cache) {
  autograd::NoGradGuard ng;
  const bool was_training = training();
  train(false);
  const int64_t len = config_.block_size, v = config_.vocab_size, total = num * len;
  const int64_t nb = config_.num_blocks(), bl = len / nb;
  const bool absorbing = config_.noise == DiffusionNoise::kAbsorbing;
  steps = std::max<int64_t>(steps, 1);
  std::vector<int32_t> x(static_cast<size_t>(total), mask_id());
  if (!absorbing) {
    for (auto& tok : x) tok = static_cast<int32_t>(rng.below(static_cast<uint64_t>(v)));
  }
  SampleStats st;
  std::vector<double> p, w(static_cast<size_t>(v));
  // With the KV cache the network sees only the current block, the clean ones before it cached.
  std::unique_ptr<nn::KvCache> cache;
  if (kv_cache && config_.block_diffusion()) {
    cache = std::make_unique<nn::KvCache>(config_.n_layer, num, len, config_.n_embd);
  }
  auto block_ids = [&](int64_t lo, int64_t hi) {  // x[:, lo:hi) as a (num, hi - lo) tensor
    std::vector<int32_t> ids(static_cast<size_t>(num * (hi - lo)));
    for (int64_t i = 0; i < num; ++i) {
      std::copy(x.begin() + i * len + lo, x.begin() + i * len + hi, ids.begin() + i * (hi - lo));
    }
    return Tensor::from_vector(ids, {num, hi - lo});
  };
  // Blocks left to right (one block of T for MDLM); the network sees the drawn blocks and the
  // current one: positions [0, hi).
  for (int64_t blk = 0; blk < nb; ++blk) {
    const int64_t lo = blk * bl, hi = lo + bl;
    // Logits row of sequence i, position j: (i * rows + j - first) of (num, rows, V).
    const int64_t rows = cache ? bl : hi, first = cache ? lo : 0;
    Tensor logits;  // (num, rows, V)
    bool changed = true;
    for (int64_t k = 0; k < steps; ++k) {
      const double t = 1.0 - static_cast<double>(k) / static_cast<double>(steps);
      const double s = 1.0 - static_cast<double>(k + 1) / static_cast<double>(steps);
      const double at = config_.alpha(t), as = config_.alpha(s);
      if (!logits.defined() || changed || !cached) {
        logits = cache ? block_forward_cached(block_ids(lo, hi), *cache, false).contiguous()
                       : prefix_forward(block_ids(0, hi)).contiguous();
        ++st.network_calls;
      } else {
        ++st.cached_steps;
      }
      ++st.steps;
      changed = false;
      const float* pl = logits.data<float>();
      for (int64_t i = 0; i < num; ++i) {
        for (int64_t j = lo; j < hi; ++j) {
          int32_t& tok = x[static_cast<size_t>(i * len + j)];
          const float* row = pl + (i * rows + j - first) * v;
          if (absorbing) {
            // A masked token is revealed with probability (alpha_s - alpha_t) / (1 - alpha_t),
            // to a token drawn from p(x0 | xt); revealed tokens stay.
            if (tok != mask_id()) continue;
            if (rng.uniform() >= (as - at) / (1.0 - at)) continue;
            softmax_row(row, v, temperature, p);
            tok = draw(p, rng);
            changed = true;
          } else {
            // q(z_s = y | z_t = z, x_theta) ∝ (a_ts [y == z] + (1 - a_ts)/N) (alpha_s p[y] +
            // (1 - alpha_s)/N).
            softmax_row(row, v, temperature, p);
            const double ats = at / as, n = static_cast<double>(v);
            for (int64_t y = 0; y < v; ++y) {
              w[y] = ((y == tok ? ats : 0.0) + (1.0 - ats) / n) * (as * p[y] + (1.0 - as) / n);
            }
            const int32_t y = draw(w, rng);
            changed = changed || y != tok;
            tok = y;
          }
        }
      }
    }
    // The block is final (the last step reveals every token): its clean keys and values join
    // the cache for the blocks after it.
    if (cache && blk + 1 < nb) {
      (void)transformer->forward_cached(block_ids(lo, hi), *cache, lo, false, true);
      ++st.kv_appends;
    }
  }
  train(was_training);
  if (stats != nullptr) *stats = st;
  return x;
}

}  // namespace starling::models
