// GPT: shapes, causality, overfitting one batch, and checkpoint round trips.
#include "models/gpt/gpt.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>

#include "core/config/toml_config.h"
#include "core/data/char_tokenizer.h"
#include "core/io/safetensors.h"
#include "core/ops/ops.h"
#include "core/optim/optimizer.h"
#include "models/gpt/checkpoint.h"

using starling::DType;
using starling::Tensor;
namespace models = starling::models;
namespace ops = starling::ops;

namespace {
models::GptConfig tiny() {
  models::GptConfig c;
  c.vocab_size = 11;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  return c;
}

Tensor ids(std::vector<int32_t> v, int64_t b, int64_t t) { return Tensor::from_vector(v, {b, t}); }

std::filesystem::path temp_path(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / "starling_models_test";
  std::filesystem::create_directories(dir);
  return dir / name;
}
}  // namespace

TEST_CASE("gpt forward shapes and parameter names follow nanoGPT", "[models][gpt]") {
  models::Gpt m(tiny(), 1);
  Tensor logits = m.forward(ids({1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 3}, 2, 6));
  REQUIRE(logits.shape() == starling::Shape{2, 6, 11});
  auto names = m.named_parameters();
  REQUIRE(names.front().first == "transformer.wte.weight");
  REQUIRE(names[1].first == "transformer.wpe.weight");
  REQUIRE(names[2].first == "transformer.h.0.ln_1.weight");
  REQUIRE(names[3].first == "transformer.h.0.attn.c_attn.weight");
  REQUIRE(names.back().first == "transformer.ln_f.weight");
  // wte + wpe + L * (2 LN + attn 4C^2 + mlp 8C^2) + ln_f, no biases.
  const int64_t c = 16;
  REQUIRE(m.num_parameters() == 11 * c + 8 * c + 2 * (2 * c + 12 * c * c) + c);
}

TEST_CASE("gpt is causal: later tokens do not change earlier logits", "[models][gpt]") {
  models::Gpt m(tiny(), 2);
  m.train(false);
  Tensor a = m.forward(ids({1, 2, 3, 4, 5}, 1, 5));
  Tensor b = m.forward(ids({1, 2, 3, 9, 9}, 1, 5));
  REQUIRE(starling::max_abs_diff(a.slice(1, 0, 3), b.slice(1, 0, 3)) == 0.0);
  REQUIRE(starling::max_abs_diff(a.slice(1, 3, 5), b.slice(1, 3, 5)) > 0.0);
}

TEST_CASE("a tiny gpt overfits one batch", "[models][gpt]") {
  models::Gpt m(tiny(), 3);
  starling::Rng rng(4);
  std::vector<int32_t> x(2 * 8), y(2 * 8);
  for (auto& v : x) v = static_cast<int32_t>(rng.below(11));
  for (auto& v : y) v = static_cast<int32_t>(rng.below(11));
  Tensor tx = ids(x, 2, 8), ty = ids(y, 2, 8);
  starling::optim::AdamW opt(starling::optim::decay_matrices_only(m.parameters()),
                             {0.9, 0.99, 1e-8, 0.0});
  const double first = m.loss(tx, ty).item();
  REQUIRE(first == Approx(std::log(11.0)).margin(0.2));
  double last = first;
  for (int i = 0; i < 150; ++i) {
    Tensor loss = m.loss(tx, ty);
    last = loss.item();
    starling::autograd::backward(loss);
    opt.step(3e-3);
    opt.zero_grad();
  }
  INFO("first " << first << " last " << last);
  REQUIRE(last < 0.1);
}

TEST_CASE("safetensors round trip gives identical logits", "[models][gpt]") {
  models::Gpt a(tiny(), 5), b(tiny(), 6);
  const Tensor in = ids({3, 1, 4, 1, 5, 9, 2, 6}, 1, 8);
  REQUIRE(starling::max_abs_diff(a.forward(in), b.forward(in)) > 0.0);
  const auto path = temp_path("roundtrip.safetensors");
  REQUIRE(starling::io::save_safetensors(path, a.state_dict()).ok());
  auto file = starling::io::load_safetensors(path);
  REQUIRE(file.ok());
  REQUIRE(b.load(file->tensors).ok());
  REQUIRE(starling::max_abs_diff(a.forward(in), b.forward(in)) == 0.0);
}

TEST_CASE("gpt checkpoint keeps config and tokenizer, bad state dicts are rejected",
          "[models][gpt]") {
  starling::v1::RunConfig cfg;
  cfg.mutable_model()->set_block_size(8);
  cfg.mutable_model()->set_n_layer(2);
  cfg.mutable_model()->set_n_head(2);
  cfg.mutable_model()->set_n_embd(16);
  auto tok = starling::data::CharTokenizer::from_corpus("hello world\n");
  REQUIRE(tok.ok());
  models::Gpt m(models::GptConfig::from_proto(cfg.model(), tok->vocab_size()), cfg.train().seed());
  const auto path = temp_path("ckpt.safetensors");
  REQUIRE(models::save_gpt_checkpoint(path, m, cfg, *tok, {7, 1.5, 1.6}).ok());
  auto loaded = models::load_gpt_checkpoint(path);
  REQUIRE(loaded.ok());
  REQUIRE(loaded->info.iter == 7);
  REQUIRE(loaded->tokenizer->vocab_size() == tok->vocab_size());
  const Tensor in = ids({1, 2, 3}, 1, 3);
  REQUIRE(starling::max_abs_diff(m.forward(in), loaded->model->forward(in)) == 0.0);

  // Wrong shape and missing / extra tensors name the tensor.
  auto sd = m.state_dict();
  starling::io::StateDict bad = sd;
  bad[0].second = Tensor::zeros({3, 3});
  auto st = m.load(bad);
  REQUIRE_FALSE(st.ok());
  REQUIRE_THAT(st.message(), Catch::Contains("transformer.wte.weight"));
  bad = sd;
  bad.pop_back();
  REQUIRE_THAT(m.load(bad).message(), Catch::Contains("transformer.ln_f.weight"));
  bad = sd;
  bad.emplace_back("extra.weight", Tensor::zeros({1}));
  REQUIRE_THAT(m.load(bad).message(), Catch::Contains("extra.weight"));

  // A corrupt checkpoint file is an error naming the file, never a crash.
  const auto corrupt = temp_path("corrupt.safetensors");
  std::filesystem::copy_file(path, corrupt, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::resize_file(corrupt, std::filesystem::file_size(corrupt) / 2);
  auto c = models::load_gpt_checkpoint(corrupt);
  REQUIRE_FALSE(c.ok());
  REQUIRE_THAT(c.status().message(), Catch::Contains("corrupt.safetensors"));
}

TEST_CASE("sampling is deterministic for a seed and respects top-k 1", "[models][gpt]") {
  models::Gpt m(tiny(), 8);
  starling::Rng r1(3), r2(3);
  auto a = m.generate({1, 2}, 12, 1.0, 0, r1);
  auto b = m.generate({1, 2}, 12, 1.0, 0, r2);
  REQUIRE(a == b);
  REQUIRE(a.size() == 14);
  // Context longer than block_size is cropped, not rejected.
  starling::Rng r3(4);
  auto greedy = m.generate({1, 2}, 10, 1.0, 1, r3);
  // top_k = 1 is greedy: each token is the argmax of the logits of its prefix.
  starling::autograd::NoGradGuard ng;
  std::vector<int32_t> ctx(greedy.begin() + 2, greedy.begin() + 10);
  Tensor logits = m.forward(Tensor::from_vector(ctx, {1, 8}));
  auto v = logits.to_float_vector();
  int best = 0;
  for (int j = 1; j < 11; ++j) {
    if (v[7 * 11 + j] > v[7 * 11 + best]) best = j;
  }
  REQUIRE(greedy[10] == best);
}

TEST_CASE("checkpoint vocabulary hex helpers round trip and reject bad input", "[models]") {
  const std::string bytes("\n !A\xff\x00", 6);
  auto back = models::hex_decode(models::hex_encode(bytes));
  REQUIRE(back.ok());
  REQUIRE(*back == bytes);
  REQUIRE_FALSE(models::hex_decode("abc").ok());
  REQUIRE_FALSE(models::hex_decode("zz").ok());
}

namespace {
// Plain-loop "rotate half" RoPE of the q or k part (columns [col, col + C)) of qkv (B, T, 3C),
// returned as (B, H, T, D) doubles.
Tensor rotated_heads(const Tensor& qkv, int64_t col, int64_t H, double base) {
  const int64_t B = qkv.shape()[0], T = qkv.shape()[1], C3 = qkv.shape()[2], C = C3 / 3;
  const int64_t D = C / H, half = D / 2;
  const auto x = qkv.to_double_vector();
  std::vector<double> out(static_cast<size_t>(B * H * T * D));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        const double* src = x.data() + (b * T + t) * C3 + col + h * D;
        double* dst = out.data() + ((b * H + h) * T + t) * D;
        for (int64_t i = 0; i < half; ++i) {
          const double a = static_cast<double>(t) * std::pow(base, -2.0 * i / D);
          dst[i] = src[i] * std::cos(a) - src[i + half] * std::sin(a);
          dst[i + half] = src[i + half] * std::cos(a) + src[i] * std::sin(a);
        }
      }
    }
  }
  return Tensor::from_vector(out, {B, H, T, D});
}
}  // namespace

TEST_CASE("gpt with rope has no wpe and matches attention over rotated q and k",
          "[models][gpt][rope]") {
  models::GptConfig c = tiny();
  c.rope = true;
  c.rope_base = 100.0;
  c.n_layer = 1;
  models::Gpt m(c, 8);
  m.train(false);
  REQUIRE(m.transformer->wpe == nullptr);
  for (const auto& [name, p] : m.named_parameters()) REQUIRE(name != "transformer.wpe.weight");
  const int64_t C = 16, H = 2, D = C / H, B = 2, T = 6;
  REQUIRE(m.num_parameters() == 11 * C + (2 * C + 12 * C * C) + C);

  const Tensor in = ids({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1}, B, T);
  // The reference: the same modules, q and k rotated by a plain loop, unpacked attention.
  const auto& blk = m.transformer->h->blocks()[0];
  const Tensor x = m.transformer->wte->forward(in);
  const Tensor qkv = blk->attn->c_attn->forward(blk->ln_1->forward(x)).to(DType::kF64);
  const Tensor q = rotated_heads(qkv, 0, H, 100.0), k = rotated_heads(qkv, C, H, 100.0);
  const Tensor v = ops::contiguous(
      ops::transpose(ops::reshape(ops::slice(qkv, 2, 2 * C, 3 * C), {B, T, H, D}), 1, 2));
  const Tensor att = ops::attention(q, k, v, true);  // (B, H, T, D)
  const Tensor y = ops::reshape(ops::contiguous(ops::transpose(att, 1, 2)), {B, T, C});
  Tensor h = ops::add(x, blk->attn->c_proj->forward(y.to(DType::kF32)));
  h = ops::add(h, blk->mlp->forward(blk->ln_2->forward(h)));
  const Tensor ref = ops::linear(m.transformer->ln_f->forward(h), m.transformer->wte->weight);
  const Tensor got = m.forward(in);
  REQUIRE(got.shape() == starling::Shape{B, T, 11});
  REQUIRE(starling::max_abs_diff(got, ref) < 1e-5);
  // Without the rotation the output differs (positions reach the model only through RoPE).
  const Tensor qn =
      ops::contiguous(ops::transpose(ops::reshape(ops::slice(qkv, 2, 0, C), {B, T, H, D}), 1, 2));
  const Tensor kn = ops::contiguous(
      ops::transpose(ops::reshape(ops::slice(qkv, 2, C, 2 * C), {B, T, H, D}), 1, 2));
  const Tensor plain = ops::attention(qn, kn, v, true);
  REQUIRE(starling::max_abs_diff(plain, att) > 1e-4);
}

TEST_CASE("a tiny gpt with rope is causal and overfits one batch", "[models][gpt][rope]") {
  models::GptConfig c = tiny();
  c.rope = true;
  models::Gpt m(c, 3);
  m.train(false);
  const Tensor a = m.forward(ids({1, 2, 3, 4, 5}, 1, 5));
  const Tensor b = m.forward(ids({1, 2, 3, 9, 9}, 1, 5));
  REQUIRE(starling::max_abs_diff(a.slice(1, 0, 3), b.slice(1, 0, 3)) == 0.0);
  m.train(true);
  starling::Rng rng(4);
  std::vector<int32_t> x(2 * 8), y(2 * 8);
  for (auto& v : x) v = static_cast<int32_t>(rng.below(11));
  for (auto& v : y) v = static_cast<int32_t>(rng.below(11));
  Tensor tx = ids(x, 2, 8), ty = ids(y, 2, 8);
  starling::optim::AdamW opt(starling::optim::decay_matrices_only(m.parameters()),
                             {0.9, 0.99, 1e-8, 0.0});
  const double first = m.loss(tx, ty).item();
  double last = first;
  for (int i = 0; i < 150; ++i) {
    Tensor loss = m.loss(tx, ty);
    last = loss.item();
    starling::autograd::backward(loss);
    opt.step(3e-3);
    opt.zero_grad();
  }
  INFO("first " << first << " last " << last);
  REQUIRE(last < 0.1);
}

TEST_CASE("model.pos_encoding parses, defaults to learned and rejects typos",
          "[models][gpt][rope]") {
  starling::v1::RunConfig c;
  REQUIRE(starling::config::parse_toml("[model]\nn_head = 2\n", "run.toml", &c).ok());
  REQUIRE(c.model().pos_encoding() == starling::v1::ModelConfig::LEARNED);
  REQUIRE_FALSE(models::GptConfig::from_proto(c.model(), 11).rope);

  REQUIRE(starling::config::parse_toml("[model]\npos_encoding = \"rope\"\nrope_base = 500.0\n",
                                       "run.toml", &c)
              .ok());
  REQUIRE(c.model().pos_encoding() == starling::v1::ModelConfig::ROPE);
  const auto g = models::GptConfig::from_proto(c.model(), 11);
  REQUIRE(g.rope);
  REQUIRE(g.rope_base == 500.0);
  REQUIRE(starling::config::validate_run_config(c, "run.toml").ok());
  // The effective config written into checkpoints carries the key and reads back.
  const std::string text = starling::config::to_toml(c);
  REQUIRE_THAT(text, Catch::Contains("pos_encoding = \"ROPE\""));
  starling::v1::RunConfig back;
  REQUIRE(starling::config::parse_toml(text, "effective.toml", &back).ok());
  REQUIRE(back.model().pos_encoding() == starling::v1::ModelConfig::ROPE);

  const auto typo =
      starling::config::parse_toml("[model]\npos_encoding = \"rotary\"\n", "run.toml", &c);
  REQUIRE_FALSE(typo.ok());
  INFO(typo.message());
  REQUIRE_THAT(typo.message(), Catch::Contains("run.toml") &&
                                   Catch::Contains("model.pos_encoding") &&
                                   Catch::Contains("rotary") && Catch::Contains("ROPE"));

  // An odd head size cannot be rotated in pairs; a base <= 1 does not rotate.
  REQUIRE(starling::config::parse_toml(
              "[model]\npos_encoding = \"rope\"\nn_embd = 12\nn_head = 4\nrope_base = 0.5\n",
              "run.toml", &c)
              .ok());
  const auto st = starling::config::validate_run_config(c, "run.toml");
  REQUIRE_THAT(st.message(),
               Catch::Contains("key 'model.rope_base' = 0.5 must be finite and > 1") &&
                   Catch::Contains("key 'model.n_embd' = 12 must give an even head size"));
  REQUIRE_FALSE(models::GptConfig::from_proto(c.model(), 11).validate().ok());
}

TEST_CASE("gpt checkpoint with rope round trips, a learned checkpoint does not load as rope",
          "[models][gpt][rope]") {
  starling::v1::RunConfig cfg;
  cfg.mutable_model()->set_block_size(8);
  cfg.mutable_model()->set_n_layer(2);
  cfg.mutable_model()->set_n_head(2);
  cfg.mutable_model()->set_n_embd(16);
  cfg.mutable_model()->set_pos_encoding(starling::v1::ModelConfig::ROPE);
  cfg.mutable_model()->set_rope_base(1000.0f);
  auto tok = starling::data::CharTokenizer::from_corpus("hello world\n");
  REQUIRE(tok.ok());
  models::Gpt m(models::GptConfig::from_proto(cfg.model(), tok->vocab_size()), 9);
  const auto path = temp_path("rope_ckpt.safetensors");
  REQUIRE(models::save_gpt_checkpoint(path, m, cfg, *tok, {4, 1.0, 1.1}).ok());
  auto loaded = models::load_gpt_checkpoint(path);
  REQUIRE(loaded.ok());
  REQUIRE(loaded->config.model().pos_encoding() == starling::v1::ModelConfig::ROPE);
  REQUIRE(loaded->model->config().rope);
  REQUIRE(loaded->model->config().rope_base == 1000.0);
  const Tensor in = ids({1, 2, 3, 4, 5}, 1, 5);
  REQUIRE(starling::max_abs_diff(m.forward(in), loaded->model->forward(in)) == 0.0);
  starling::Rng r1(3), r2(3);
  REQUIRE(m.generate({1}, 6, 0.8, 0, r1) == loaded->model->generate({1}, 6, 0.8, 0, r2));

  // Weights of a learned-position model carry wpe, which a RoPE model refuses by name.
  starling::v1::RunConfig learned = cfg;
  learned.mutable_model()->set_pos_encoding(starling::v1::ModelConfig::LEARNED);
  models::Gpt l(models::GptConfig::from_proto(learned.model(), tok->vocab_size()), 9);
  REQUIRE_THAT(m.load(l.state_dict()).message(), Catch::Contains("transformer.wpe.weight"));
}
