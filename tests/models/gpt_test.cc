// GPT: shapes, causality, overfitting one batch, and checkpoint round trips.
#include "models/gpt/gpt.h"

#include <catch2/catch.hpp>
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

TEST_CASE("gpt checkpoint keeps config and tokenizer; bad state dicts are rejected",
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
