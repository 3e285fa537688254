// The inference-time KV cache: ops::attention_kv against attention_packed and a float64 loop,
// the cached transformer against the uncached one, and the GPT and block-diffusion MDLM samplers
// with and without the cache.
#include "core/nn/kv_cache.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/config/toml_config.h"
#include "core/ops/concat.h"
#include "core/ops/ops.h"
#include "core/util/rng.h"
#include "core/wire/config.pb.h"
#include "models/gpt/gpt.h"
#include "models/mdlm/mdlm.h"

using starling::DType;
using starling::Rng;
using starling::Tensor;
namespace models = starling::models;
namespace nn = starling::nn;
namespace ops = starling::ops;
namespace autograd = starling::autograd;

namespace {

double max_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const Tensor ac = a.to(DType::kF64).contiguous(), bc = b.to(DType::kF64).contiguous();
  double m = 0.0;
  for (int64_t i = 0; i < ac.numel(); ++i) {
    m = std::max(m, std::abs(ac.data<double>()[i] - bc.data<double>()[i]));
  }
  return m;
}

// Plain-loop float64 attention over a packed (B, T, 3C) qkv whose q and k are already rotated:
// query i sees keys [0, visible(i)).
template <typename Visible>
std::vector<double> reference_attention(const Tensor& qkv, int64_t H, Visible visible) {
  const Tensor x = qkv.to(DType::kF64).contiguous();
  const double* p = x.data<double>();
  const int64_t B = qkv.shape()[0], T = qkv.shape()[1], C = qkv.shape()[2] / 3, D = C / H;
  std::vector<double> out(static_cast<size_t>(B * T * C), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        const int64_t n = visible(i);
        std::vector<double> s(static_cast<size_t>(n));
        double mx = -1e300;
        for (int64_t j = 0; j < n; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < D; ++d) {
            dot += p[(b * T + i) * 3 * C + h * D + d] * p[(b * T + j) * 3 * C + C + h * D + d];
          }
          s[j] = dot / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, s[j]);
        }
        double sum = 0.0;
        for (auto& v : s) sum += (v = std::exp(v - mx));
        for (int64_t j = 0; j < n; ++j) {
          for (int64_t d = 0; d < D; ++d) {
            out[(b * T + i) * C + h * D + d] +=
                s[j] / sum * p[(b * T + j) * 3 * C + 2 * C + h * D + d];
          }
        }
      }
    }
  }
  return out;
}

double max_diff_ref(const Tensor& a, const std::vector<double>& ref) {
  const Tensor ac = a.to(DType::kF64).contiguous();
  REQUIRE(ac.numel() == static_cast<int64_t>(ref.size()));
  double m = 0.0;
  for (int64_t i = 0; i < ac.numel(); ++i) {
    m = std::max(m, std::abs(ac.data<double>()[i] - ref[static_cast<size_t>(i)]));
  }
  return m;
}

// Rows [lo, hi) of a (B, T, K) tensor, contiguous.
Tensor rows(const Tensor& x, int64_t lo, int64_t hi) {
  return ops::slice(x, 1, lo, hi).contiguous();
}

models::GptConfig tiny_gpt(bool rope) {
  models::GptConfig c;
  c.vocab_size = 11;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.rope = rope;
  return c;
}

models::MdlmConfig tiny_bd3(bool rope) {
  models::MdlmConfig c;
  c.vocab_size = 11;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.rope = rope;
  c.block_length = 4;
  c.masking = models::MaskSampling::kCount;
  return c;
}

// Spreads random weights wider than the N(0, 0.02) init so that logits are far from uniform
// and a wrong cache would change the samples.
void widen(nn::Module& m, uint64_t seed) {
  Rng rng(seed);
  autograd::NoGradGuard ng;
  for (Tensor p : m.parameters()) {
    const Tensor r = Tensor::randn(p.shape(), rng, 0.3);
    std::copy_n(r.data<float>(), r.numel(), p.data<float>());
  }
}

}  // namespace

TEST_CASE("kv cache: attention_kv matches attention_packed and a float64 loop",
          "[kv_cache][attention]") {
  const bool rope = GENERATE(false, true);
  const bool causal = GENERATE(true, false);  // false: block-causal blocks of 3
  const DType dtype = GENERATE(DType::kF32, DType::kF64);
  const int64_t B = 2, T = 9, H = 2, C = 8, blk = 3;
  Rng rng(7);
  const Tensor qkv = Tensor::randn({B, T, 3 * C}, rng, 1.0, 0.0, dtype);
  const Tensor rotated = rope ? ops::rope_packed(qkv, H, 500.0) : qkv;
  const ops::AttnMask mask = causal ? ops::AttnMask::causal() : ops::AttnMask::block_causal(blk);
  const Tensor full = ops::attention_packed(rotated, H, mask);
  const auto ref = reference_attention(
      rotated, H, [&](int64_t i) { return causal ? i + 1 : (i / blk + 1) * blk; });

  autograd::NoGradGuard ng;
  // Causal: a prefill of 4 rows, then one row at a time. Block-causal: one block at a time.
  std::vector<int64_t> cuts =
      causal ? std::vector<int64_t>{0, 4, 5, 6, 7, 8, 9} : std::vector<int64_t>{0, 3, 6, 9};
  Tensor k = Tensor::zeros({B, T, C}, dtype), v = Tensor::zeros({B, T, C}, dtype);
  std::vector<Tensor> parts;
  for (size_t c = 0; c + 1 < cuts.size(); ++c) {
    ops::KvAttnOptions opt;
    opt.causal = causal;
    opt.rope = rope;
    opt.rope_base = 500.0;
    opt.pos0 = cuts[c];
    parts.push_back(ops::attention_kv(rows(qkv, cuts[c], cuts[c + 1]), k, v, cuts[c], H, opt));
  }
  const Tensor cached = ops::cat(parts, 1);
  const double tol = dtype == DType::kF64 ? 1e-12 : 2e-6;
  CHECK(max_diff(cached, full) < tol);
  CHECK(max_diff_ref(cached, ref) < tol);
  CHECK(max_diff_ref(full, ref) < tol);
  // The cache holds the rotated keys and the values of every row.
  const Tensor kr = ops::slice(rotated, 2, C, 2 * C), vr = ops::slice(rotated, 2, 2 * C, 3 * C);
  CHECK(max_diff(k, kr) < tol);
  CHECK(max_diff(v, vr) < tol);
}

TEST_CASE("kv cache: a block run without append leaves the cache as it was", "[kv_cache]") {
  Rng init(3), drop(4);
  nn::TransformerShape s{16, 2, 1, 0.0, false, false};
  s.rope = true;
  nn::Block block(s, init, drop);
  block.train(false);
  autograd::NoGradGuard ng;
  Rng rng(5);
  const Tensor x = Tensor::randn({1, 8, 16}, rng);
  nn::KvCache cache(1, 1, 8, 16);
  nn::LayerKv& kv = cache.layer(0);
  (void)block.forward_cached(rows(x, 0, 4), kv, 0, false, true);
  REQUIRE(cache.length() == 4);
  const Tensor k_before = kv.k.clone();
  const Tensor a = block.forward_cached(rows(x, 4, 8), kv, 4, false, false);
  REQUIRE(cache.length() == 4);
  // Another noisy block in the scratch rows: the first one left no trace.
  (void)block.forward_cached(Tensor::randn({1, 4, 16}, rng), kv, 4, false, false);
  const Tensor b = block.forward_cached(rows(x, 4, 8), kv, 4, false, true);
  REQUIRE(cache.length() == 8);
  REQUIRE(max_diff(a, b) == 0.0);
  REQUIRE(max_diff(rows(kv.k, 0, 4), rows(k_before, 0, 4)) == 0.0);
  // Both blocks together with the block-causal mask give the same rows.
  const Tensor whole = block.forward(x, ops::AttnMask::block_causal(4));
  REQUIRE(max_diff(b, rows(whole, 4, 8)) < 1e-5);
  cache.clear();
  REQUIRE(cache.length() == 0);
}

TEST_CASE("kv cache: the cached GPT trunk gives the uncached logits", "[kv_cache][gpt]") {
  const bool rope = GENERATE(false, true);
  models::Gpt m(tiny_gpt(rope), 11);
  widen(m, 12);
  m.train(false);
  autograd::NoGradGuard ng;
  const std::vector<int32_t> seq{3, 1, 4, 1, 5, 9, 2, 6};
  const Tensor full = m.forward(Tensor::from_vector(seq, {1, 8}));
  nn::KvCache cache(2, 1, 8, 16);
  std::vector<Tensor> parts;
  for (const auto& [lo, hi] : std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 4}, {4, 8}}) {
    const std::vector<int32_t> part(seq.begin() + lo, seq.begin() + hi);
    const Tensor h = m.transformer->forward_cached(Tensor::from_vector(part, {1, hi - lo}), cache,
                                                   lo, true, true);
    parts.push_back(ops::linear(h, m.transformer->wte->weight));
  }
  REQUIRE(cache.length() == 8);
  REQUIRE(max_diff(ops::cat(parts, 1), full) < 1e-4);
}

TEST_CASE("kv cache: GPT generate gives the uncached tokens", "[kv_cache][gpt]") {
  const bool rope = GENERATE(false, true);
  struct Case {
    std::vector<int32_t> prompt;
    int64_t max_new;
    int64_t top_k;
  };
  // block_size 8: a short prompt running past block_size, a prompt of exactly block_size, one
  // longer than block_size, and top-k.
  const Case c =
      GENERATE(Case{{1}, 20, 0}, Case{{2, 7, 1}, 12, 4}, Case{{1, 2, 3, 4, 5, 6, 7, 8}, 5, 0},
               Case{{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1}, 6, 3});
  models::Gpt m(tiny_gpt(rope), 21);
  widen(m, 22);
  for (uint64_t seed : {1u, 2u, 3u}) {
    Rng r1(seed), r2(seed);
    const auto cached = m.generate(c.prompt, c.max_new, 1.0, c.top_k, r1, true);
    const auto uncached = m.generate(c.prompt, c.max_new, 1.0, c.top_k, r2, false);
    INFO("rope " << rope << " prompt " << c.prompt.size() << " seed " << seed);
    REQUIRE(cached.size() == c.prompt.size() + static_cast<size_t>(c.max_new));
    REQUIRE(cached == uncached);
    REQUIRE(r1.uniform() == r2.uniform());  // the same number of draws
  }
  REQUIRE(m.training());
}

TEST_CASE("kv cache: the cached block logits equal prefix_forward's last block",
          "[kv_cache][mdlm]") {
  const bool rope = GENERATE(false, true);
  models::Mdlm m(tiny_bd3(rope), 31);
  widen(m, 32);
  m.train(false);
  autograd::NoGradGuard ng;
  Rng rng(33);
  std::vector<int32_t> x(2 * 16);
  for (auto& t : x) t = static_cast<int32_t>(rng.below(12));  // [MASK] = 11 included
  const Tensor ids = Tensor::from_vector(x, {2, 16});
  nn::KvCache cache(2, 2, 16, 16);
  for (int64_t blk = 0; blk < 4; ++blk) {
    const Tensor block = rows(ids, blk * 4, blk * 4 + 4);
    const Tensor cached = m.block_forward_cached(block, cache, false);
    const Tensor full = m.prefix_forward(rows(ids, 0, blk * 4 + 4));
    INFO("block " << blk);
    REQUIRE(cache.length() == blk * 4);
    REQUIRE(max_diff(cached, rows(full, blk * 4, blk * 4 + 4)) < 1e-4);
    (void)m.block_forward_cached(block, cache, true);
  }
  REQUIRE(cache.length() == 16);
}

TEST_CASE("kv cache: the block-diffusion sampler gives the uncached ids", "[kv_cache][mdlm]") {
  const bool rope = GENERATE(false, true);
  const bool reuse = GENERATE(false, true);  // the `cached` option (skip unchanged steps)
  models::Mdlm m(tiny_bd3(rope), 41);
  widen(m, 42);
  const int64_t steps = 5;
  for (uint64_t seed : {1u, 2u}) {
    Rng r1(seed), r2(seed);
    models::SampleStats s1, s2;
    const auto kv = m.sample(3, steps, 1.0, reuse, r1, &s1, true);
    const auto plain = m.sample(3, steps, 1.0, reuse, r2, &s2, false);
    INFO("rope " << rope << " reuse " << reuse << " seed " << seed);
    REQUIRE(kv == plain);
    REQUIRE(s1.network_calls == s2.network_calls);
    REQUIRE(s1.cached_steps == s2.cached_steps);
    REQUIRE(s1.kv_appends == 3);  // every block but the last
    REQUIRE(s2.kv_appends == 0);
    if (!reuse) REQUIRE(s1.network_calls == 4 * steps);
    for (int32_t id : kv) REQUIRE((id >= 0 && id < 11));
  }
  REQUIRE(m.training());
}

TEST_CASE("kv cache: [sample] kv_cache is on by default and read from TOML", "[kv_cache][config]") {
  starling::v1::RunConfig cfg;
  REQUIRE(cfg.sample().kv_cache());
  REQUIRE(starling::config::parse_toml("[sample]\nkv_cache = false\n", "s.toml", &cfg).ok());
  REQUIRE_FALSE(cfg.sample().kv_cache());
  const starling::Status bad =
      starling::config::parse_toml("[sample]\nkv_cache = 3\n", "s.toml", &cfg);
  REQUIRE_FALSE(bad.ok());
  REQUIRE_THAT(bad.message(), Catch::Contains("s.toml:2") && Catch::Contains("sample.kv_cache"));
}
