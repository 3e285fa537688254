// The fused GPT trainer on the CPU backend against the autograd GPT: logits, loss, every
// gradient, 10 steps of train_gpt's loop, state dict round trips, refused configs, and training
// steps replayed as graphs.
#include "models/gpt/fused_gpt.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/autograd/autograd.h"
#include "core/config/toml_config.h"
#include "core/io/safetensors.h"
#include "models/gpt/fused_backend.h"
#include "models/gpt/fused_trainer.h"
#include "models/gpt/trainer.h"
#include "tests/testing/fused_weights.h"
#include "tests/testing/tiny_runs.h"

namespace starling::models {
namespace {

GptConfig tiny(bool bias) {
  GptConfig c;
  c.vocab_size = 13;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.bias = bias;
  return c;
}

std::vector<int32_t> random_tokens(size_t n, int64_t v, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> out(n);
  for (auto& x : out) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(v)));
  return out;
}

std::unique_ptr<FusedGpt> make_fused(const GptConfig& c, int64_t b, int64_t t) {
  auto m = FusedGpt::make(c, b, t, 1, make_fused_cpu_backend());
  REQUIRE(m.ok());
  return std::move(*m);
}

TEST_CASE("fused GPT layout is models::Gpt's state dict, in order", "[models][fused]") {
  const bool bias = GENERATE(false, true);
  const GptConfig c = tiny(bias);
  const Gpt g(c, 7);
  const auto sd = g.state_dict();
  const auto layout = fused_gpt_layout(c);
  REQUIRE(layout.size() == sd.size());
  size_t offset = 0;
  for (size_t i = 0; i < sd.size(); ++i) {
    INFO(sd[i].first);
    CHECK(layout[i].name == sd[i].first);
    CHECK(layout[i].shape == sd[i].second.shape());
    CHECK(layout[i].offset == offset);
    CHECK(layout[i].decay == (sd[i].second.dim() >= 2));
    offset += layout[i].numel;
  }
  REQUIRE(offset == static_cast<size_t>(g.num_parameters()));
}

TEST_CASE("fused GPT logits and loss equal the autograd GPT's", "[models][fused]") {
  const bool bias = GENERATE(false, true);
  const int64_t t = GENERATE(int64_t{8}, int64_t{5});  // full block and a shorter sequence
  const bool causal = GENERATE(true, false);           // false: bidirectional (the MDLM's trunk)
  INFO("bias " << bias << " T " << t << " causal " << causal);
  GptConfig c = tiny(bias);
  c.causal = causal;
  const int64_t b = 3;
  const auto sd = testing::random_fused_weights(c, 11);
  Gpt ref(c, 1);
  REQUIRE(ref.load(sd).ok());
  auto fused = make_fused(c, b, t);
  REQUIRE(fused->load(sd).ok());
  const auto x = random_tokens(static_cast<size_t>(b * t), c.vocab_size, 21);
  const auto y = random_tokens(static_cast<size_t>(b * t), c.vocab_size, 22);

  auto loss = fused->loss(x.data(), y.data(), x.size());
  REQUIRE(loss.ok());
  const Tensor want_logits = ref.forward(Tensor::from_vector(x, {b, t}));
  const double want_loss =
      ref.loss(Tensor::from_vector(x, {b, t}), Tensor::from_vector(y, {b, t})).item();
  const auto logits = fused->logits_host();
  REQUIRE(logits.size() == static_cast<size_t>(want_logits.numel()));
  // fp32 on both sides, the same BLAS: the difference is summation order only.
  CHECK(testing::normalized_error(logits.data(), want_logits.data<float>(), logits.size()) <= 1e-5);
  CHECK(*loss == Approx(want_loss).epsilon(1e-6));
}

TEST_CASE("fused GPT gradients match autograd for every parameter", "[models][fused]") {
  const bool bias = GENERATE(false, true);
  const bool causal = GENERATE(true, false);
  INFO("bias " << bias << " causal " << causal);
  GptConfig c = tiny(bias);
  c.causal = causal;
  const int64_t b = 4, t = 8;
  const auto sd = testing::random_fused_weights(c, 12);
  Gpt ref(c, 1);
  REQUIRE(ref.load(sd).ok());
  auto fused = make_fused(c, b, t);
  REQUIRE(fused->load(sd).ok());
  const auto x = random_tokens(static_cast<size_t>(b * t), c.vocab_size, 31);
  const auto y = random_tokens(static_cast<size_t>(b * t), c.vocab_size, 32);

  auto loss = fused->forward_backward(x.data(), y.data(), x.size());
  REQUIRE(loss.ok());
  Tensor ref_loss = ref.loss(Tensor::from_vector(x, {b, t}), Tensor::from_vector(y, {b, t}));
  autograd::backward(ref_loss);
  CHECK(*loss == Approx(ref_loss.item()).epsilon(1e-6));
  const auto grads = fused->gradients_host();
  testing::check_fused_gradients(fused->layout(), grads, ref.named_parameters(), 1e-4);
}

TEST_CASE("fused GPT with RoPE: logits and loss and every gradient equal the autograd GPT's",
          "[models][fused]") {
  const bool bias = GENERATE(false, true);
  const bool causal = GENERATE(true, false);
  const int64_t t = GENERATE(int64_t{8}, int64_t{5});  // full block and a shorter sequence
  INFO("bias " << bias << " causal " << causal << " T " << t);
  GptConfig c = tiny(bias);
  c.causal = causal;
  c.rope = true;
  c.rope_base = 100.0;  // large angles at these tiny T: every pair turns visibly
  const int64_t b = 3;
  const auto sd = testing::random_fused_weights(c, 13);
  Gpt ref(c, 1);
  REQUIRE(ref.load(sd).ok());
  auto fused = make_fused(c, b, t);
  // models::Gpt's state dict without wpe, so checkpoints interchange.
  for (const auto& p : fused->layout()) CHECK(p.name != "transformer.wpe.weight");
  REQUIRE(fused->load(sd).ok());
  const auto x = random_tokens(static_cast<size_t>(b * t), c.vocab_size, 33);
  const auto y = random_tokens(static_cast<size_t>(b * t), c.vocab_size, 34);

  auto loss = fused->forward_backward(x.data(), y.data(), x.size());
  REQUIRE(loss.ok());
  const Tensor want_logits = ref.forward(Tensor::from_vector(x, {b, t}));
  const auto logits = fused->logits_host();
  REQUIRE(logits.size() == static_cast<size_t>(want_logits.numel()));
  CHECK(testing::normalized_error(logits.data(), want_logits.data<float>(), logits.size()) <= 1e-5);
  Tensor ref_loss = ref.loss(Tensor::from_vector(x, {b, t}), Tensor::from_vector(y, {b, t}));
  autograd::backward(ref_loss);
  CHECK(*loss == Approx(ref_loss.item()).epsilon(1e-6));
  const auto grads = fused->gradients_host();
  testing::check_fused_gradients(fused->layout(), grads, ref.named_parameters(), 1e-5);
  // The positions matter: the same weights without RoPE give other logits.
  GptConfig learned = c;
  learned.rope = false;
  Gpt plain(learned, 1);
  auto plain_sd = sd;
  plain_sd.emplace(plain_sd.begin() + 1, "transformer.wpe.weight",
                   Tensor::zeros({c.block_size, c.n_embd}));
  REQUIRE(plain.load(plain_sd).ok());
  const Tensor no_rope = plain.forward(Tensor::from_vector(x, {b, t}));
  CHECK(testing::normalized_error(logits.data(), no_rope.data<float>(), logits.size()) > 1e-3);
  // A learned-position checkpoint does not load into the rotary trunk: wpe is named.
  CHECK_THAT(fused->load(plain_sd).message(), Catch::Contains("transformer.wpe.weight"));
}

v1::RunConfig tiny_run(const std::filesystem::path& dir, const std::string& out,
                       const std::string& extra = "") {
  return testing::tiny_text_run(dir, out, R"(
[model]
arch = "gpt"
block_size = 16
n_layer = 2
n_head = 2
n_embd = 32
bias = true
)" + extra);
}

TEST_CASE("10 fused training steps give train_gpt's losses", "[models][fused]") {
  const bool rope = GENERATE(false, true);  // learned positions; rotary ones (no wpe)
  INFO("rope " << rope);
  const auto dir = std::filesystem::temp_directory_path() /
                   (rope ? "starling_fused_gpt_rope" : "starling_fused_gpt_test");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string extra = rope ? "pos_encoding = \"rope\"\nrope_base = 1000.0\n" : "";
  const auto cfg_a = tiny_run(dir, "autograd", extra);
  const auto cfg_f = tiny_run(dir, "fused", extra);
  REQUIRE((cfg_f.model().pos_encoding() == v1::ModelConfig::ROPE) == rope);
  auto ra = train_gpt(cfg_a, "autograd.toml");
  REQUIRE(ra.ok());
  auto rf = train_gpt_fused(cfg_f, "fused.toml", FusedTrainOptions{});
  INFO(rf.status().message());
  REQUIRE(rf.ok());
  const auto seen = testing::compare_engine_metrics(dir / "autograd" / "metrics.jsonl",
                                                    dir / "fused" / "metrics.jsonl");
  REQUIRE(seen.train_lines == 10);
  REQUIRE(seen.finals == 1);
  REQUIRE(seen.clipped > 0);  // the clipping path ran
  CHECK(rf->val_loss == Approx(ra->val_loss).margin(1e-4));
  // Same outputs as train_gpt: the checkpoint loads into models::Gpt with the same tensors
  // (no wpe with RoPE).
  for (const char* f : {"ckpt.safetensors", "best.safetensors", "config.toml"}) {
    INFO(f);
    CHECK(std::filesystem::exists(dir / "fused" / f));
  }
  auto ckpt_f = io::load_safetensors(dir / "fused" / "ckpt.safetensors");
  auto ckpt_a = io::load_safetensors(dir / "autograd" / "ckpt.safetensors");
  REQUIRE(ckpt_f.ok());
  REQUIRE(ckpt_a.ok());
  REQUIRE(ckpt_f->tensors.size() == ckpt_a->tensors.size());
  for (size_t i = 0; i < ckpt_f->tensors.size(); ++i) {
    CHECK(ckpt_f->tensors[i].first == ckpt_a->tensors[i].first);
    CHECK(ckpt_f->tensors[i].second.shape() == ckpt_a->tensors[i].second.shape());
    if (rope) CHECK(ckpt_f->tensors[i].first != "transformer.wpe.weight");
  }
  // Same metadata keys (the config differs in train.out_dir only).
  REQUIRE(ckpt_f->metadata.size() == ckpt_a->metadata.size());
  for (const auto& [k, v] : ckpt_a->metadata) CHECK(ckpt_f->metadata.count(k) == 1);
  std::filesystem::remove_all(dir);
}

TEST_CASE("train.engine selects the fused trainer from TOML", "[models][fused]") {
  v1::RunConfig cfg;
  REQUIRE(cfg.train().engine() == v1::TrainConfig::AUTOGRAD);  // the default
  REQUIRE(config::parse_toml("[train]\nengine = \"fused\"\n", "e.toml", &cfg).ok());
  CHECK(cfg.train().engine() == v1::TrainConfig::FUSED);
  CHECK_THAT(config::to_toml(cfg), Catch::Contains("engine = \"FUSED\""));
  const Status bad = config::parse_toml("[train]\nengine = \"tape\"\n", "e.toml", &cfg);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.message(), Catch::Contains("train.engine"));
}

TEST_CASE("fused GPT state dict round trip", "[models][fused]") {
  const bool bias = GENERATE(false, true);
  const GptConfig c = tiny(bias);
  // make() initializes exactly as models::Gpt(config, seed).
  auto fused = make_fused(c, 2, 8);
  const auto init = Gpt(c, 1).state_dict();
  auto out = fused->state_dict();
  REQUIRE(out.size() == init.size());
  for (size_t i = 0; i < out.size(); ++i) {
    CHECK(out[i].first == init[i].first);
    CHECK(max_abs_diff(out[i].second, init[i].second) == 0.0);
  }
  // Load, export: bit for bit; nanoGPT's tied lm_head.weight is accepted and ignored.
  auto sd = testing::random_fused_weights(c, 3);
  sd.emplace_back("lm_head.weight", sd[0].second);
  REQUIRE(fused->load(sd).ok());
  out = fused->state_dict();
  REQUIRE(out.size() + 1 == sd.size());
  for (size_t i = 0; i < out.size(); ++i) CHECK(max_abs_diff(out[i].second, sd[i].second) == 0.0);
  Gpt g(c, 2);
  REQUIRE(g.load(out).ok());
}

TEST_CASE("fused GPT refuses what it cannot run", "[models][fused]") {
  GptConfig c = tiny(false);
  SECTION("dropout") {
    c.dropout = 0.1;
    const Status st = check_fused_gpt_config(c, 2, 8);
    REQUIRE(st.code() == StatusCode::kUnimplemented);
    CHECK_THAT(st.message(), Catch::Contains("model.dropout"));
  }
  SECTION("rope needs an even head size") {
    c.rope = true;
    REQUIRE(check_fused_gpt_config(c, 2, 8).ok());
    c.n_embd = 18;  // D = 9
    const Status st = check_fused_gpt_config(c, 2, 8);
    REQUIRE(st.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(st.message(), Catch::Contains("model.pos_encoding"));
  }
  SECTION("masks the sequence does not fit") {
    // Block diffusion over 2T = 8 rows: blocks of 2 fit, 3 do not; 2T > block_size is fine
    // since positions repeat with period T = 4.
    CHECK(check_fused_gpt_config(c, 2, 8, ops::AttnMask::block_diffusion(2)).ok());
    CHECK(check_fused_gpt_config(c, 2, 16, ops::AttnMask::block_diffusion(2)).ok());
    CHECK_FALSE(check_fused_gpt_config(c, 2, 8, ops::AttnMask::block_diffusion(3)).ok());
    CHECK_THAT(check_fused_gpt_config(c, 2, 18, ops::AttnMask::block_diffusion(3)).message(),
               Catch::Contains("block_size"));
  }
  SECTION("sequence longer than the block") {
    CHECK_THAT(check_fused_gpt_config(c, 2, 9).message(), Catch::Contains("block_size"));
    CHECK_FALSE(check_fused_gpt_config(c, 0, 8).ok());
    CHECK_FALSE(FusedGpt::make(c, 2, 9, 1, make_fused_cpu_backend()).ok());
  }
  SECTION("bad batches") {
    auto m = make_fused(c, 2, 4);
    std::vector<int32_t> x(8, 1), y(8, 2);
    CHECK_THAT(m->loss(x.data(), y.data(), 7).status().message(), Catch::Contains("B*T"));
    y[5] = 13;
    CHECK_THAT(m->loss(x.data(), y.data(), 8).status().message(), Catch::Contains("position 5"));
    y[5] = 2;
    x[3] = -1;
    CHECK_THAT(m->train_step(x.data(), y.data(), 8, 1e-3, {}, 1.0).status().message(),
               Catch::Contains("position 3"));
  }
  SECTION("bad state dicts leave the weights unchanged") {
    auto m = make_fused(c, 2, 4);
    const auto before = m->parameters_host();
    auto sd = testing::random_fused_weights(c, 4);
    auto missing = sd;
    missing.erase(missing.begin() + 3);
    CHECK_THAT(m->load(missing).message(), Catch::Contains(sd[3].first));
    auto misshapen = sd;
    misshapen[1].second = Tensor::zeros({4, 16});
    CHECK_THAT(m->load(misshapen).message(), Catch::Contains("transformer.wpe.weight"));
    auto extra = sd;
    extra.emplace_back("transformer.h.9.ln_1.weight", Tensor::zeros({16}));
    CHECK_THAT(m->load(extra).message(), Catch::Contains("transformer.h.9.ln_1.weight"));
    CHECK(m->parameters_host() == before);
  }
  SECTION("non-GPT archs, SGD, and CUDA without a GPU") {
    const auto dir = std::filesystem::temp_directory_path() / "starling_fused_gpt_refuse";
    std::filesystem::create_directories(dir);
    auto cfg = tiny_run(dir, "out");
    cfg.mutable_model()->set_arch(v1::ModelConfig::MDLM);
    CHECK_THAT(train_gpt_fused(cfg, "x.toml", {}).status().message(),
               Catch::Contains("model.arch"));
    cfg = tiny_run(dir, "out");
    cfg.mutable_train()->set_optimizer(v1::TrainConfig::SGD);
    CHECK_THAT(train_gpt_fused(cfg, "x.toml", {}).status().message(), Catch::Contains("adamw"));
    cfg = tiny_run(dir, "out");
    cfg.mutable_model()->set_dropout(0.2f);
    CHECK_THAT(train_gpt_fused(cfg, "x.toml", {}).status().message(),
               Catch::Contains("model.dropout"));
    // Without a CUDA build or a GPU (this check's usual home), --device cuda is an error.
    if (!make_fused_cuda_backend(0).ok()) {
      cfg = tiny_run(dir, "out");
      const auto r = train_gpt_fused(cfg, "x.toml", FusedTrainOptions{.cuda = true});
      REQUIRE_FALSE(r.ok());
      CHECK_THAT(r.status().message(), Catch::Contains("cuda", Catch::CaseSensitive::No));
    }
    auto b = make_fused_cuda_backend(-1);
    CHECK_FALSE(b.ok());
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE("fused GPT data parallel on CPU threads follows one engine under train_gpt",
          "[models][fused]") {
  // FusedTrainOptions::ranks: each rank a replica on B/ranks rows, gradients averaged over a
  // ThreadGroup (the code --gpus 0,1 runs over NCCL); train_gpt's loop, evaluations and
  // checkpoints unchanged.
  const int n = GENERATE(2, 4);
  INFO("ranks " << n);
  const auto dir =
      std::filesystem::temp_directory_path() / ("starling_fused_ranks_" + std::to_string(n));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto one = train_gpt_fused(tiny_run(dir, "one"), "one.toml", FusedTrainOptions{});
  REQUIRE(one.ok());
  FusedTrainOptions o;
  o.ranks = n;
  auto many = train_gpt_fused(tiny_run(dir, "many"), "many.toml", o);
  INFO(many.status().message());
  REQUIRE(many.ok());
  // Losses, gradient norms and evaluations within 1e-4 (the same batches, sums in another order).
  const auto seen = testing::compare_engine_metrics(dir / "one" / "metrics.jsonl",
                                                    dir / "many" / "metrics.jsonl");
  CHECK(seen.train_lines == 10);
  CHECK(seen.finals == 1);
  CHECK(many->val_loss == Approx(one->val_loss).margin(1e-4));
  auto a = io::load_safetensors(dir / "one" / "ckpt.safetensors");
  auto b = io::load_safetensors(dir / "many" / "ckpt.safetensors");
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(a->tensors.size() == b->tensors.size());
  for (size_t i = 0; i < a->tensors.size(); ++i) {
    INFO(a->tensors[i].first);
    CHECK(a->tensors[i].first == b->tensors[i].first);
    // 1.5e-6 measured after 10 AdamW steps at learning rates up to 3e-3.
    CHECK(starling::max_abs_diff(a->tensors[i].second, b->tensors[i].second) < 1e-4);
  }
  // A batch that does not split over the ranks is refused by name.
  o.ranks = 3;
  auto odd = train_gpt_fused(tiny_run(dir, "odd"), "odd.toml", o);
  REQUIRE_FALSE(odd.ok());
  CHECK_THAT(odd.status().message(), Catch::Contains("not a multiple of the 3 data-parallel"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("fused GPT steps are deterministic and overfit one batch", "[models][fused]") {
  const GptConfig c = tiny(true);
  auto m1 = make_fused(c, 2, 8);
  auto m2 = make_fused(c, 2, 8);
  const auto x = random_tokens(16, c.vocab_size, 41), y = random_tokens(16, c.vocab_size, 42);
  const FusedOptimizer opt{0.9, 0.99, 1e-8, 0.0};
  double first = 0.0, last = 0.0;
  for (int i = 0; i < 100; ++i) {
    auto s1 = m1->train_step(x.data(), y.data(), x.size(), 3e-3, opt, 1.0);
    REQUIRE(s1.ok());
    if (i < 3) {
      auto s2 = m2->train_step(x.data(), y.data(), x.size(), 3e-3, opt, 1.0);
      REQUIRE(s2.ok());
      REQUIRE(s1->loss == s2->loss);
      REQUIRE(s1->grad_norm == s2->grad_norm);
    }
    if (i == 0) first = s1->loss;
    last = s1->loss;
  }
  CHECK(first == Approx(std::log(13.0)).margin(0.3));
  CHECK(last < 0.5 * first);
  CHECK(m1->steps() == 100);
}

// gpt_train_bench --profile: every operation of a step timed where it runs (the CPU backend: the
// host clock), summed per label; profiling changes no result.
TEST_CASE("fused GPT profiling times every operation of a step and changes nothing",
          "[models][fused]") {
  const GptConfig c = tiny(true);
  auto plain = make_fused(c, 2, 8);
  auto timed = make_fused(c, 2, 8);
  const auto x = random_tokens(16, c.vocab_size, 43), y = random_tokens(16, c.vocab_size, 44);
  const FusedOptimizer opt{0.9, 0.99, 1e-8, 0.1};
  timed->backend().set_profiling(true);
  const int steps = 3;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) {
    auto a = plain->train_step(x.data(), y.data(), x.size(), 3e-3, opt, 1.0);
    auto b = timed->train_step(x.data(), y.data(), x.size(), 3e-3, opt, 1.0);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(a->loss == b->loss);
    CHECK(a->grad_norm == b->grad_norm);
  }
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  CHECK(plain->parameters_host() == timed->parameters_host());
  CHECK(plain->backend().take_profile().empty());
  const auto entries = timed->backend().take_profile();
  const auto calls = [&](const std::string& label) -> int64_t {
    for (const auto& e : entries)
      if (e.label == label) return e.calls;
    return -1;
  };
  // Per step: one per layer of each block operation, the final layer norm too, one of each
  // whole-model operation.
  CHECK(calls("attention fwd") == steps * c.n_layer);
  CHECK(calls("attention bwd") == steps * c.n_layer);
  CHECK(calls("linear qkv bwd") == steps * c.n_layer);
  CHECK(calls("layer_norm fwd") == steps * (2 * c.n_layer + 1));
  CHECK(calls("residual add") == steps * 4 * c.n_layer);
  for (const char* once :
       {"batch upload", "embedding fwd", "head fwd", "cross_entropy fwd", "zero gradients",
        "cross_entropy bwd", "head bwd", "embedding bwd", "gradient norm + clip", "adamw"}) {
    INFO(once);
    CHECK(calls(once) == steps);
  }
  double sum = 0.0;
  for (const auto& e : entries) {
    CHECK(e.ms >= 0.0);
    sum += e.ms;
  }
  CHECK(sum > 0.0);
  CHECK(sum <= wall_ms);  // the plain engine's steps ran in the same window
  CHECK(timed->backend().take_profile().empty());  // taken: starts afresh
  const std::string table = fused_profile_table(entries, steps, wall_ms / (2 * steps));
  CHECK_THAT(table, Catch::Contains("| attention bwd | 2 |") &&
                        Catch::Contains("(rest of the step: host, gaps)"));
}

}  // namespace
}  // namespace starling::models

namespace starling::models {
namespace {

TEST_CASE("weighted cross-entropy over a padded vocabulary matches float64", "[models][fused]") {
  // Rows of VP = 7 logits, the softmax over the first V = 5; per-row weights; ignored rows.
  const int n = 6, v = 5, vp = 7;
  Rng rng(3);
  std::vector<float> logits(static_cast<size_t>(n) * vp), weights(n);
  for (auto& x : logits) x = static_cast<float>(rng.normal() * 2.0);
  for (int j = v; j < vp; ++j) logits[2 * vp + j] = 50.0f;  // padding never enters the softmax
  for (auto& w : weights) w = static_cast<float>(0.1 + rng.uniform());
  const std::vector<int> targets = {0, 4, 2, -1, 3, -1};
  auto backend = make_fused_cpu_backend();
  std::vector<float> losses(n), dlogits(logits.size(), 123.0f);
  float loss = 0.0f;
  backend->cross_entropy_forward(losses.data(), &loss, logits.data(), targets.data(),
                                 weights.data(), n, v, vp);
  backend->cross_entropy_backward(dlogits.data(), logits.data(), targets.data(), weights.data(), n,
                                  v, vp);
  double want_loss = 0.0;
  for (int r = 0; r < n; ++r) {
    INFO("row " << r);
    const float* row = logits.data() + static_cast<size_t>(r) * vp;
    const float* d = dlogits.data() + static_cast<size_t>(r) * vp;
    for (int j = v; j < vp; ++j) CHECK(d[j] == 0.0f);
    if (targets[r] < 0) {
      CHECK(losses[r] == 0.0f);
      for (int j = 0; j < v; ++j) CHECK(d[j] == 0.0f);
      continue;
    }
    double mx = row[0], s = 0.0;
    for (int j = 1; j < v; ++j) mx = std::max(mx, static_cast<double>(row[j]));
    for (int j = 0; j < v; ++j) s += std::exp(row[j] - mx);
    const double ce = mx + std::log(s) - row[targets[r]];
    CHECK(losses[r] == Approx(ce).epsilon(1e-6));
    want_loss += weights[r] * ce;
    for (int j = 0; j < v; ++j) {
      const double p = std::exp(row[j] - mx) / s;
      CHECK(d[j] == Approx(weights[r] * (p - (j == targets[r] ? 1.0 : 0.0))).margin(1e-7));
    }
  }
  CHECK(loss == Approx(want_loss).epsilon(1e-6));
  // Without weights: the mean over all rows, as before (every target valid).
  const std::vector<int> all = {0, 4, 2, 1, 3, 0};
  backend->cross_entropy_forward(losses.data(), &loss, logits.data(), all.data(), nullptr, n, v,
                                 vp);
  double mean = 0.0;
  for (int r = 0; r < n; ++r) mean += losses[r];
  CHECK(loss == Approx(mean / n).epsilon(1e-6));
}

TEST_CASE("fused GPT weighted batches: loss vocabulary and ignored targets", "[models][fused]") {
  // The weighted loss with weights 1/N on every position is the mean loss; a loss vocabulary
  // below V leaves the head's extra rows without gradient from the loss.
  GptConfig c = tiny(true);
  const int64_t b = 2, t = 8;
  const size_t n = static_cast<size_t>(b * t);
  auto m = make_fused(c, b, t);
  const auto x = random_tokens(n, c.vocab_size, 51), y = random_tokens(n, c.vocab_size, 52);
  const std::vector<float> w(n, 1.0f / static_cast<float>(n));
  auto mean = m->loss(x.data(), y.data(), n);
  auto weighted = m->loss(FusedBatch{x.data(), y.data(), w.data(), n});
  REQUIRE(mean.ok());
  REQUIRE(weighted.ok());
  CHECK(*weighted == Approx(*mean).epsilon(1e-6));
  CHECK_FALSE(m->set_loss_vocab(0).ok());
  CHECK_FALSE(m->set_loss_vocab(c.vocab_size + 1).ok());
  REQUIRE(m->set_loss_vocab(c.vocab_size - 2).ok());
  auto yl = y;
  for (auto& e : yl) e = e % static_cast<int32_t>(c.vocab_size - 2);
  yl[3] = -1;  // ignored: a weighted batch only
  CHECK_THAT(m->loss(x.data(), yl.data(), n).status().message(), Catch::Contains("position 3"));
  yl[4] = static_cast<int32_t>(c.vocab_size - 2);  // outside the loss vocabulary
  CHECK_THAT(m->loss(FusedBatch{x.data(), yl.data(), w.data(), n}).status().message(),
             Catch::Contains("position 4"));
  yl[4] = 0;
  // Inputs without the last two tokens: wte's rows V-2 and V-1 then get no gradient at all (the
  // loss never reads their logits), while the other rows do.
  auto xl = x;
  for (auto& e : xl) e = e % static_cast<int32_t>(c.vocab_size - 2);
  REQUIRE(m->forward_backward(FusedBatch{xl.data(), yl.data(), w.data(), n}).ok());
  const auto g = m->gradients_host();
  const int64_t C = c.n_embd;
  double extra = 0.0, data_rows = 0.0;
  for (int64_t tok = 0; tok < c.vocab_size; ++tok) {
    for (int64_t j = 0; j < C; ++j) {
      (tok >= c.vocab_size - 2 ? extra : data_rows) +=
          std::abs(g[static_cast<size_t>(tok * C + j)]);
    }
  }
  CHECK(extra == 0.0);
  CHECK(data_rows > 0.0);
}

TEST_CASE("fused GPT loss runs fewer rows than the engine holds", "[models][fused]") {
  // The loss of the first r rows alone equals the loss of all B rows with rows r.. ignored;
  // training still needs all B rows, and the count must be whole rows.
  GptConfig c = tiny(true);
  const int64_t b = 3, t = 8;
  const size_t n = static_cast<size_t>(b * t), r = static_cast<size_t>(t);
  auto m = make_fused(c, b, t);
  const auto x = random_tokens(n, c.vocab_size, 61), y = random_tokens(n, c.vocab_size, 62);
  std::vector<float> w(n, 0.0f);
  auto yp = y;
  for (size_t i = 0; i < n; ++i) {
    if (i < r) w[i] = 1.0f / static_cast<float>(r);
    if (i >= r) yp[i] = -1;
  }
  auto padded = m->loss(FusedBatch{x.data(), yp.data(), w.data(), n});
  auto one_row = m->loss(FusedBatch{x.data(), y.data(), w.data(), r});
  auto mean_one = m->loss(FusedBatch{x.data(), y.data(), nullptr, r});
  REQUIRE(padded.ok());
  REQUIRE(one_row.ok());
  REQUIRE(mean_one.ok());
  CHECK(*one_row == Approx(*padded).epsilon(1e-6));
  CHECK(*mean_one == Approx(*padded).epsilon(1e-6));
  CHECK(m->logits_host().size() == r * static_cast<size_t>(c.vocab_size));
  CHECK_THAT(m->loss(FusedBatch{x.data(), y.data(), nullptr, r + 1}).status().message(),
             Catch::Contains("r*T"));
  CHECK_FALSE(m->forward_backward(FusedBatch{x.data(), y.data(), w.data(), r}).ok());
  // A full batch after a short one runs all rows again.
  REQUIRE(m->forward_backward(FusedBatch{x.data(), yp.data(), w.data(), n}).ok());
  CHECK(m->logits_host().size() == n * static_cast<size_t>(c.vocab_size));
}

TEST_CASE("bf16 linear layers round GEMM inputs to nearest even and accumulate in fp32",
          "[models][fused]") {
  auto backend = make_fused_cpu_backend();
  // x: (1, 3), weight: (2, 3). In bf16 (8 significant bits) 1 + 2^-9 rounds down to 1,
  // 1 + 2^-8 is a tie that goes to the even 1, 1 + 3 * 2^-8 a tie that goes up to 1 + 2^-6.
  const float e = 1.0f / 256.0f;
  const std::vector<float> x = {1.0f + e / 2, 1.0f + e, 1.0f + 3 * e};
  const std::vector<float> w = {1.0f, 0.0f, 0.0f, 0.0f, 1.0f, 1.0f};
  auto* dx = static_cast<float*>(*backend->alloc(x.size() * 4));
  auto* dw = static_cast<float*>(*backend->alloc(w.size() * 4));
  auto* dy = static_cast<float*>(*backend->alloc(2 * 4));
  backend->copy_to_backend(dx, x.data(), x.size() * 4);
  backend->copy_to_backend(dw, w.data(), w.size() * 4);
  std::vector<float> y(2);
  backend->linear_forward(dy, dx, dw, nullptr, 1, 3, 2);
  backend->copy_to_host(y.data(), dy, 8);
  CHECK(y[0] == 1.0f + e / 2);  // fp32: exact inputs
  CHECK(y[1] == (1.0f + e) + (1.0f + 3 * e));
  REQUIRE(backend->set_bf16_matmuls(true, 64).ok());
  backend->linear_forward(dy, dx, dw, nullptr, 1, 3, 2);
  backend->copy_to_host(y.data(), dy, 8);
  CHECK(y[0] == 1.0f);
  CHECK(y[1] == 1.0f + (1.0f + 4 * e));
  // The inputs themselves are untouched.
  std::vector<float> back(3);
  backend->copy_to_host(back.data(), dx, 12);
  CHECK(back == x);
  backend->free(dx);
  backend->free(dw);
  backend->free(dy);
}

TEST_CASE("bf16 linear layers train within 1e-2 of fp32 over 10 steps", "[models][fused]") {
  const auto c = tiny(true);
  const int64_t b = 4;
  auto fp32 = make_fused(c, b, c.block_size);
  auto bf16 = make_fused(c, b, c.block_size);
  REQUIRE(bf16->set_bf16_matmuls(true).ok());
  const size_t n = static_cast<size_t>(b * c.block_size);
  const FusedOptimizer opt{0.9, 0.99, 1e-8, 0.1};
  double most = 0.0;
  for (int it = 0; it < 10; ++it) {
    const auto x = random_tokens(n, c.vocab_size, 300 + it);
    const auto y = random_tokens(n, c.vocab_size, 400 + it);
    auto a = fp32->train_step(x.data(), y.data(), n, 3e-3, opt, 1.0);
    auto h = bf16->train_step(x.data(), y.data(), n, 3e-3, opt, 1.0);
    REQUIRE(a.ok());
    REQUIRE(h.ok());
    INFO("step " << it << ": fp32 " << a->loss << ", bf16 " << h->loss);
    CHECK(std::abs(h->loss - a->loss) <= 1e-2 * a->loss);
    most = std::max(most, std::abs(h->loss - a->loss));
  }
  CHECK(most > 0.0);  // the rounding happened
}

// Training steps as graphs (FusedGpt::set_graphs) checked on the CPU: a backend that records
// the calls made between begin_capture and end_capture instead of running them, each with its
// arguments as they were (pointers and scalars, as a CUDA graph keeps its kernels' arguments),
// and replays them on replay. Steps replayed from such a recording must equal eager steps bit
// for bit: anything that changes from step to step outside the engine's fixed buffers (a batch's
// token buckets, the learning rate, the step count) would be replayed stale and show here.
// The CPU backend behind a recorder: every enqueued operation is run, or recorded while
// capturing. Queries and memory management pass straight through.
class RecordingBackend final : public FusedBackend {
 public:
  RecordingBackend() : inner_(make_fused_cpu_backend()) {}
  std::string name() const override { return "recording cpu"; }

  Status begin_capture() override {
    if (recording_) return failed_precondition("capture already on");
    recording_ = std::make_shared<std::vector<std::function<void()>>>();
    return ok_status();
  }
  Result<std::shared_ptr<void>> end_capture() override {
    if (!recording_) return failed_precondition("no capture on");
    ++captures;
    auto graph = std::move(recording_);
    recording_.reset();
    return std::shared_ptr<void>(graph);
  }
  void replay(const std::shared_ptr<void>& graph) override {
    ++replays;
    for (const auto& op : *static_cast<std::vector<std::function<void()>>*>(graph.get())) op();
  }

  Result<void*> alloc(size_t nbytes) override {
    CHECK_FALSE(recording_);  // a capture allocates nothing
    return inner_->alloc(nbytes);
  }
  void free(void* p) override { inner_->free(p); }
  void copy_to_backend(void* dst, const void* src, size_t n) override {
    CHECK_FALSE(recording_);  // host data would be read at capture time only
    inner_->copy_to_backend(dst, src, n);
  }
  void copy_to_host(void* dst, const void* src, size_t n) override {
    CHECK_FALSE(recording_);  // a wait inside a capture
    inner_->copy_to_host(dst, src, n);
  }
  void synchronize() override {
    CHECK_FALSE(recording_);
    inner_->synchronize();
  }
  Status set_bf16_matmuls(bool on, size_t scratch) override {
    bf16_matmuls_ = on;
    return inner_->set_bf16_matmuls(on, scratch);
  }
  size_t attention_state_floats(int b, int t, int c, int h) const override {
    return inner_->attention_state_floats(b, t, c, h);
  }
  size_t attention_scratch_floats(int b, int t, int c, int h) const override {
    return inner_->attention_scratch_floats(b, t, c, h);
  }
  size_t bytes_in_use() const override { return inner_->bytes_in_use(); }
  size_t peak_bytes() const override { return inner_->peak_bytes(); }

  // Enqueued operations: arguments captured by value, as a graph's kernel nodes keep them.
  void zero(void* p, size_t n) override {
    run([=, this] { inner_->zero(p, n); });
  }
  void encoder_forward(float* out, const int* idx, const float* wte, const float* wpe, int b, int t,
                       int c) override {
    run([=, this] { inner_->encoder_forward(out, idx, wte, wpe, b, t, c); });
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const EncoderBuckets& bk,
                        int b, int t, int c) override {
    run([=, this] { inner_->encoder_backward(dwte, dwpe, dout, bk, b, t, c); });
  }
  void layer_norm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                          const float* bias, int n, int c) override {
    run([=, this] { inner_->layer_norm_forward(out, mean, rstd, x, w, bias, n, c); });
  }
  void layer_norm_backward(float* dx, float* dw, float* db, const float* dout, const float* x,
                           const float* w, const float* mean, const float* rstd, int n,
                           int c) override {
    run([=, this] { inner_->layer_norm_backward(dx, dw, db, dout, x, w, mean, rstd, n, c); });
  }
  void linear_forward(float* out, const float* x, const float* w, const float* bias, int n, int in,
                      int o) override {
    run([=, this] { inner_->linear_forward(out, x, w, bias, n, in, o); });
  }
  void linear_backward(float* dx, float* dw, float* db, const float* dout, const float* x,
                       const float* w, int n, int in, int o) override {
    run([=, this] { inner_->linear_backward(dx, dw, db, dout, x, w, n, in, o); });
  }
  void attention_forward(float* out, float* att, const float* qkv, int b, int t, int c, int h,
                         const ops::AttnMask& mask) override {
    run([=, this] { inner_->attention_forward(out, att, qkv, b, t, c, h, mask); });
  }
  void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                          const float* out, const float* att, int b, int t, int c, int h,
                          const ops::AttnMask& mask) override {
    run([=, this] {
      inner_->attention_backward(dqkv, scratch, dout, qkv, out, att, b, t, c, h, mask);
    });
  }
  void rope(float* qkv, const float* cos, const float* sin, int n, int c, int h, int period,
            bool inverse) override {
    run([=, this] { inner_->rope(qkv, cos, sin, n, c, h, period, inverse); });
  }
  void gelu_forward(float* out, const float* x, size_t n) override {
    run([=, this] { inner_->gelu_forward(out, x, n); });
  }
  void gelu_backward(float* dx, const float* dout, const float* x, size_t n) override {
    run([=, this] { inner_->gelu_backward(dx, dout, x, n); });
  }
  void residual_add(float* out, const float* a, const float* b, size_t n) override {
    run([=, this] { inner_->residual_add(out, a, b, n); });
  }
  void cross_entropy_forward(float* losses, float* loss, const float* logits, const int* targets,
                             const float* weights, int n, int v, int vp) override {
    run([=, this] {
      inner_->cross_entropy_forward(losses, loss, logits, targets, weights, n, v, vp);
    });
  }
  void cross_entropy_backward(float* dlogits, const float* logits, const int* targets,
                              const float* weights, int n, int v, int vp) override {
    run([=, this] { inner_->cross_entropy_backward(dlogits, logits, targets, weights, n, v, vp); });
  }
  void adamw(float* p, const float* g, float* m, float* v, size_t n, const FusedAdamW& s) override {
    run([=, this] { inner_->adamw(p, g, m, v, n, s); });
  }
  void sum_squares(double* out, const float* x, size_t n) override {
    run([=, this] { inner_->sum_squares(out, x, n); });
  }
  void clip_scale(float* x, size_t n, const double* norm_sq, double max_norm) override {
    run([=, this] { inner_->clip_scale(x, n, norm_sq, max_norm); });
  }
  void subtract(float* out, const float* a, const float* b, size_t n) override {
    run([=, this] { inner_->subtract(out, a, b, n); });
  }

  int captures = 0, replays = 0;

 private:
  void run(std::function<void()> op) {
    if (recording_) {
      recording_->push_back(std::move(op));
    } else {
      op();
    }
  }

  std::unique_ptr<FusedBackend> inner_;
  std::shared_ptr<std::vector<std::function<void()>>> recording_;
};

TEST_CASE("training steps replayed as a graph equal eager steps bit for bit", "[models][fused]") {
  const bool rope = GENERATE(false, true);
  INFO("rope " << rope);
  GptConfig c = tiny(true);
  c.rope = rope;
  const int64_t b = 3, t = 8;
  auto rec = std::make_unique<RecordingBackend>();
  RecordingBackend* recorder = rec.get();
  auto graphed = FusedGpt::make(c, b, t, 5, std::move(rec));
  auto eager = FusedGpt::make(c, b, t, 5, make_fused_cpu_backend());
  REQUIRE(graphed.ok());
  REQUIRE(eager.ok());
  (*eager)->set_graphs(false);
  CHECK((*eager)->graph_note() == "off");
  const FusedOptimizer opt{0.9, 0.95, 1e-8, 0.1};
  for (int step = 0; step < 6; ++step) {
    INFO("step " << step);
    // A new batch (new tokens: other token buckets for the embedding gradient) and a new
    // learning rate every step, clipping that scales.
    const auto x = random_tokens(static_cast<size_t>(b * t), c.vocab_size, 100 + step);
    const auto y = random_tokens(static_cast<size_t>(b * t), c.vocab_size, 200 + step);
    const double lr = 1e-2 / (1 + step);
    auto rg = (*graphed)->train_step(x.data(), y.data(), x.size(), lr, opt, 0.5);
    auto re = (*eager)->train_step(x.data(), y.data(), x.size(), lr, opt, 0.5);
    REQUIRE(rg.ok());
    REQUIRE(re.ok());
    CHECK(rg->loss == re->loss);
    CHECK(rg->grad_norm == re->grad_norm);
    CHECK((*graphed)->parameters_host() == (*eager)->parameters_host());
  }
  // Step 0 eager (warm-up), step 1 captured and replayed, steps 2..5 replayed.
  CHECK(recorder->captures == 1);
  CHECK(recorder->replays == 5);
  CHECK_THAT((*graphed)->graph_note(), Catch::Contains("captured"));
  // forward_backward and loss stay eager and agree with the graphed engine's state.
  const auto x = random_tokens(static_cast<size_t>(b * t), c.vocab_size, 7);
  auto lg = (*graphed)->loss(x.data(), x.data(), x.size());
  auto le = (*eager)->loss(x.data(), x.data(), x.size());
  REQUIRE(lg.ok());
  REQUIRE(le.ok());
  CHECK(*lg == *le);
  CHECK(recorder->replays == 5);
}

TEST_CASE("a backend that cannot capture leaves the steps eager and says why", "[models][fused]") {
  const GptConfig c = tiny(false);
  auto m = FusedGpt::make(c, 2, 8, 5, make_fused_cpu_backend());
  REQUIRE(m.ok());
  CHECK((*m)->graphs());
  const FusedOptimizer opt{0.9, 0.95, 1e-8, 0.0};
  for (int step = 0; step < 3; ++step) {
    const auto x = random_tokens(16, c.vocab_size, 50 + step);
    REQUIRE((*m)->train_step(x.data(), x.data(), x.size(), 1e-3, opt, 0.0).ok());
  }
  CHECK_FALSE((*m)->graphs());
  CHECK_THAT((*m)->graph_note(), Catch::Contains("cannot capture"));
}

}  // namespace
}  // namespace starling::models
