// The fused MDLM (models/mdlm/fused_engine.h) on the CPU backend against the autograd Mdlm: loss
// and every gradient for the same x0, xt and t; the corruption drawn for a step; 10 steps of
// train_mdlm's loop; checkpoints read by `starling sample` / `eval`; refused configs.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/autograd/autograd.h"
#include "core/config/toml_config.h"
#include "models/gpt/checkpoint.h"
#include "models/mdlm/checkpoint.h"
#include "models/mdlm/fused_engine.h"
#include "models/mdlm/trainer.h"
#include "tests/testing/fused_weights.h"
#include "tests/testing/tiny_runs.h"

namespace starling::models {
namespace {

constexpr int64_t kV = 11, kT = 8;

MdlmConfig tiny(bool bias) {
  MdlmConfig c;
  c.vocab_size = kV;
  c.block_size = kT;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.bias = bias;
  return c;
}

Tensor random_x0(int64_t b, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> x(static_cast<size_t>(b * kT));
  for (auto& e : x) e = static_cast<int32_t>(rng.below(static_cast<uint64_t>(kV)));
  return Tensor::from_vector(x, {b, kT});
}

std::unique_ptr<FusedMdlm> make_fused(const MdlmConfig& c, int64_t b) {
  auto m = FusedMdlm::make(c, b, 1, make_fused_cpu_backend());
  INFO(m.status().message());
  REQUIRE(m.ok());
  return std::move(*m);
}

TEST_CASE("fused MDLM loss, logits and every gradient equal the autograd Mdlm's",
          "[models][fused]") {
  // (bias, rope, block_length): the plain MDLM with and without biases; rotary positions; block
  // diffusion over blocks of 2 and 4 with learned positions (wpe read with period T) and with
  // rotary ones (angles with period T).
  const auto [bias, rope, block_length] = GENERATE(table<bool, bool, int64_t>({{false, false, 0},
                                                                               {true, false, 0},
                                                                               {true, true, 0},
                                                                               {true, false, 2},
                                                                               {true, false, 4},
                                                                               {true, true, 2},
                                                                               {true, true, 4}}));
  const int64_t b = GENERATE(int64_t{3}, int64_t{2});  // a full batch, and fewer rows
  INFO("bias " << bias << " rope " << rope << " block_length " << block_length << " rows " << b);
  MdlmConfig c = tiny(bias);
  c.rope = rope;
  c.rope_base = 100.0;
  c.block_length = block_length;
  const auto sd = testing::random_fused_weights(c.trunk_config(), 13);
  Mdlm ref(c, 1);
  REQUIRE(ref.load(sd).ok());
  auto fused = make_fused(c, 3);
  const int64_t seq = block_length > 0 ? 2 * kT : kT;
  REQUIRE(fused->trunk().time() == seq);
  REQUIRE(fused->trunk().positions() == kT);
  REQUIRE(fused->load(sd).ok());
  const Tensor x0 = random_x0(b, 23);
  Rng rng(24);
  const auto t = ref.sample_times(b * c.num_blocks(), rng);
  const NoisedBatch nb = ref.corrupt(x0, t, rng);
  int masked = 0;
  for (int64_t i = 0; i < nb.xt.numel(); ++i) masked += nb.xt.data<int32_t>()[i] == kV ? 1 : 0;
  REQUIRE(masked > 0);
  REQUIRE(masked < nb.xt.numel());

  auto loss = fused->forward_backward(x0, nb.t, nb.xt);
  INFO(loss.status().message());
  REQUIRE(loss.ok());
  Tensor ref_loss = ref.loss(x0, nb.t, nb.xt);
  autograd::backward(ref_loss);
  CHECK(*loss == Approx(ref_loss.item()).epsilon(1e-5));
  // The data logits of the x_t half are Mdlm::forward's.
  const Tensor want = ref.forward(nb.xt, x0);        // (b, T, V)
  const auto logits = fused->trunk().logits_host();  // (rows, seq, V + 1)
  double err = 0.0, scale = 1e-30;
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t j = 0; j < kT; ++j) {
      for (int64_t v = 0; v < kV; ++v) {
        const double w = want.data<float>()[(i * kT + j) * kV + v];
        err =
            std::max(err, std::abs(logits[static_cast<size_t>((i * seq + j) * (kV + 1) + v)] - w));
        scale = std::max(scale, std::abs(w));
      }
    }
  }
  CHECK(err / scale <= 1e-5);

  const auto grads = fused->trunk().gradients_host();
  testing::check_fused_gradients(fused->trunk().layout(), grads, ref.named_parameters(), 1e-5);
  // wte's [MASK] row learns through the inputs only; the head never sees its logit.
  const auto& wte = fused->trunk().layout()[0];
  REQUIRE(wte.shape == Shape{kV + 1, 16});
  double mask_row = 0.0;
  for (int64_t j = 0; j < 16; ++j) mask_row += std::abs(grads[wte.offset + kV * 16 + j]);
  CHECK(mask_row > 0.0);
  // The forward-only loss is the same number.
  auto again = fused->loss(x0, nb.t, nb.xt);
  REQUIRE(again.ok());
  CHECK(*again == *loss);
}

TEST_CASE("fused MDLM draws Mdlm::loss's corruption", "[models][fused]") {
  // bernoulli, count, antithetic count: the step's loss is Mdlm::loss(x0, rng)'s for the same
  // weights and rng, and both leave the rng in the same state.
  const int mode = GENERATE(0, 1, 2);
  const int64_t block_length = GENERATE(int64_t{0}, int64_t{4});  // one time per block of 4
  INFO("mode " << mode << " block_length " << block_length);
  MdlmConfig c = tiny(false);
  c.block_length = block_length;
  c.masking = mode == 0 ? MaskSampling::kBernoulli : MaskSampling::kCount;
  c.antithetic = mode == 2;
  const auto sd = testing::random_fused_weights(c.trunk_config(), 12);
  Mdlm ref(c, 1);
  REQUIRE(ref.load(sd).ok());
  auto fused = make_fused(c, 4);
  REQUIRE(fused->rows() == (mode == 2 ? 8 : 4));
  REQUIRE(fused->load(sd).ok());
  const Tensor x0 = random_x0(4, 31);
  Rng ra(32), rf(32);
  const double want = ref.loss(x0, ra).item();
  const FusedMdlm::Draw d = fused->draw(x0, rf);
  CHECK(ra.uniform() == rf.uniform());
  REQUIRE(d.x0.shape() == d.noised.xt.shape());
  REQUIRE(d.x0.shape()[0] == fused->rows());
  auto got = fused->loss(d.x0, d.noised.t, d.noised.xt);
  REQUIRE(got.ok());
  CHECK(*got == Approx(want).epsilon(1e-5));
}

TEST_CASE("fused MDLM initializes as Mdlm(config, seed) and round trips its state dict",
          "[models][fused]") {
  const MdlmConfig c = tiny(true);
  auto fused = make_fused(c, 2);
  const auto init = Mdlm(c, 1).state_dict();
  auto out = fused->state_dict();
  REQUIRE(out.size() == init.size());
  for (size_t i = 0; i < out.size(); ++i) {
    CHECK(out[i].first == init[i].first);
    CHECK(max_abs_diff(out[i].second, init[i].second) == 0.0);
  }
  const auto sd = testing::random_fused_weights(c.trunk_config(), 5);
  REQUIRE(fused->load(sd).ok());
  auto host = fused->host_model();
  REQUIRE(host.ok());
  const auto back = (*host)->state_dict();
  for (size_t i = 0; i < back.size(); ++i) CHECK(max_abs_diff(back[i].second, sd[i].second) == 0.0);
}

// `model` adds [model] keys, `diffusion` [diffusion] keys.
v1::RunConfig tiny_run(const std::filesystem::path& dir, const std::string& out,
                       const std::string& diffusion = "", const std::string& model = "") {
  return testing::tiny_text_run(dir, out,
                                R"(
[model]
arch = "mdlm"
block_size = 16
n_layer = 2
n_head = 2
n_embd = 32
bias = true
causal = false
)" + model + "[diffusion]\nsampling_steps = 8\n" +
                                    diffusion);
}

TEST_CASE("10 fused MDLM training steps give train_mdlm's losses", "[models][fused]") {
  // (rope, [diffusion] keys): Bernoulli masks; antithetic count masks (2B rows); rotary
  // positions; block diffusion over blocks of 2 (learned positions); blocks of 4 with rotary
  // positions and antithetic count masks (2B rows of [x_t | x_0]).
  const auto [rope, diffusion] = GENERATE(table<bool, std::string>(
      {{false, ""},
       {false, "masking = \"count\"\nantithetic = true\n"},
       {true, ""},
       {false, "block_length = 2\n"},
       {true, "block_length = 4\nmasking = \"count\"\nantithetic = true\n"}}));
  INFO("rope " << rope << " diffusion " << diffusion);
  const auto dir = std::filesystem::temp_directory_path() / "starling_fused_mdlm_steps";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string model = rope ? "pos_encoding = \"rope\"\n" : "";
  const auto cfg_a = tiny_run(dir, "autograd", diffusion, model);
  const auto cfg_f = tiny_run(dir, "fused", diffusion, model);
  auto ra = train_mdlm(cfg_a, "autograd.toml");
  REQUIRE(ra.ok());
  auto rf = train_mdlm_fused(cfg_f, "fused.toml", FusedTrainOptions{});
  INFO(rf.status().message());
  REQUIRE(rf.ok());
  const auto seen = testing::compare_engine_metrics(dir / "autograd" / "metrics.jsonl",
                                                    dir / "fused" / "metrics.jsonl");
  REQUIRE(seen.train_lines == 10);
  REQUIRE(seen.finals == 1);
  REQUIRE(seen.clipped > 0);  // the clipping path ran
  CHECK(rf->val_loss == Approx(ra->val_loss).margin(1e-4));
  CHECK(rf->best_val_loss == Approx(ra->best_val_loss).margin(1e-4));
  // The checkpoint loads back as the configured model (the sampler reads it).
  auto loaded = load_mdlm_checkpoint(dir / "fused" / "ckpt.safetensors");
  INFO(loaded.status().message());
  REQUIRE(loaded.ok());
  CHECK(loaded->model->config().rope == rope);
  CHECK(loaded->model->config().block_diffusion() ==
        (diffusion.find("block_length") != std::string::npos));
  std::filesystem::remove_all(dir);
}

TEST_CASE("a fused MDLM checkpoint is read by starling sample and eval", "[models][fused]") {
  const auto dir = std::filesystem::temp_directory_path() / "starling_fused_mdlm_ckpt";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto cfg = tiny_run(dir, "fused");
  cfg.mutable_train()->set_max_iters(4);
  cfg.mutable_train()->set_eval_interval(2);
  auto rf = train_mdlm_fused(cfg, "fused.toml", FusedTrainOptions{});
  INFO(rf.status().message());
  REQUIRE(rf.ok());
  for (const char* f : {"ckpt.safetensors", "best.safetensors", "config.toml", "metrics.jsonl"}) {
    INFO(f);
    CHECK(std::filesystem::exists(dir / "fused" / f));
  }
  // `starling eval`: load_mdlm_checkpoint + mdlm_eval_full over the split the run evaluated; the
  // autograd model on the saved weights gives the fused run's final figure.
  auto loaded = load_mdlm_checkpoint(dir / "fused" / "ckpt.safetensors");
  INFO(loaded.status().message());
  REQUIRE(loaded.ok());
  CHECK(loaded->info.iter == 4);
  CHECK(loaded->model->transformer->wte->weight.shape()[0] == loaded->model->mask_id() + 1);
  auto text = load_text_data(loaded->config, "ckpt");
  REQUIRE(text.ok());
  const double nelbo = mdlm_eval_full(*loaded->model, text->dataset.tokens(data::Split::kVal),
                                      cfg.train().batch_size());
  const auto m = testing::read_metrics(dir / "fused" / "metrics.jsonl");
  REQUIRE(m.back()["event"] == "final");
  CHECK(nelbo == Approx(m.back()["val_loss_full"].get<double>()).margin(1e-4));
  // `starling sample`: the ancestral sampler on the checkpoint.
  auto sample = sample_mdlm_checkpoint(dir / "fused" / "ckpt.safetensors", 0, 1.0, 7, 2);
  INFO(sample.status().message());
  REQUIRE(sample.ok());
  CHECK(sample->size() == static_cast<size_t>(2 * 16 + 5));
  std::filesystem::remove_all(dir);
}

TEST_CASE("fused MDLM refuses what it cannot run, naming the key", "[models][fused]") {
  MdlmConfig c = tiny(false);
  auto refused = [&](const std::string& key) {
    const Status st = check_fused_mdlm_config(c, 2);
    REQUIRE(st.code() == StatusCode::kUnimplemented);
    CHECK_THAT(st.message(), Catch::Contains(key));
    CHECK_FALSE(FusedMdlm::make(c, 2, 1, make_fused_cpu_backend()).ok());
  };
  SECTION("rope and block diffusion run") {
    c.rope = true;
    c.block_length = 2;
    CHECK(check_fused_mdlm_config(c, 2).ok());
    CHECK(fused_mdlm_attn_mask(c).kind == ops::AttnMask::Kind::kBlockDiffusion);
    CHECK(fused_mdlm_attn_mask(c).block == 2);
    c.block_length = 3;  // does not divide T = 8
    CHECK_FALSE(check_fused_mdlm_config(c, 2).ok());
  }
  SECTION("uniform noise") {
    c.noise = DiffusionNoise::kUniform;
    refused("diffusion.noise");
  }
  SECTION("dropout") {
    c.dropout = 0.1;
    refused("model.dropout");
  }
  SECTION("block_length = block_size is the plain MDLM") {
    c.block_length = kT;
    CHECK(check_fused_mdlm_config(c, 2).ok());
  }
  SECTION("bad batches name what is wrong") {
    auto m = make_fused(c, 2);
    const Tensor x0 = random_x0(2, 3);
    Tensor xt = x0.clone();
    xt.data<int32_t>()[5] = kV;
    const std::vector<double> t = {0.5, 0.5};
    REQUIRE(m->loss(x0, t, xt).ok());
    CHECK_THAT(m->loss(random_x0(3, 3), std::vector<double>{0.5, 0.5, 0.5}, random_x0(3, 3))
                   .status()
                   .message(),
               Catch::Contains("1 to 2"));
    CHECK_THAT(m->loss(x0, std::vector<double>{0.5}, xt).status().message(),
               Catch::Contains("one each"));
    MdlmConfig bd = c;
    bd.block_length = 4;
    auto mb = make_fused(bd, 2);
    CHECK_THAT(mb->loss(x0, t, xt).status().message(), Catch::Contains("2 each"));
    const std::vector<double> tb = {0.5, 0.5, 0.5, 0.5};
    REQUIRE(mb->loss(x0, tb, xt).ok());
    CHECK_THAT(mb->loss(x0, std::vector<double>{0.5, 0.5, 0.5, 2.0}, xt).status().message(),
               Catch::Contains("sequence 1, block 1"));
    CHECK_THAT(m->loss(x0, std::vector<double>{0.5, 0.0}, xt).status().message(),
               Catch::Contains("sequence 1"));
    xt.data<int32_t>()[6] = kV + 1;
    CHECK_THAT(m->loss(x0, t, xt).status().message(), Catch::Contains("position 6"));
    Rng rng(1);
    CHECK_THAT(m->train_step(random_x0(1, 3), rng, 1e-3, {}, 1.0).status().message(),
               Catch::Contains("(B = 2"));
  }
  SECTION("the trainer: SGD, non-MDLM archs, and CUDA without a GPU") {
    const auto dir = std::filesystem::temp_directory_path() / "starling_fused_mdlm_refuse";
    std::filesystem::create_directories(dir);
    auto cfg = tiny_run(dir, "out");
    cfg.mutable_train()->set_optimizer(v1::TrainConfig::SGD);
    CHECK_THAT(train_mdlm_fused(cfg, "x.toml", {}).status().message(),
               Catch::Contains("train.optimizer"));
    cfg = tiny_run(dir, "out");
    cfg.mutable_diffusion()->set_noise(v1::DiffusionConfig::UNIFORM);
    auto r = train_mdlm_fused(cfg, "x.toml", {});
    CHECK_THAT(r.status().message(), Catch::Contains("x.toml"));
    CHECK_THAT(r.status().message(), Catch::Contains("diffusion.noise"));
    cfg = tiny_run(dir, "out");
    cfg.mutable_model()->set_arch(v1::ModelConfig::GPT);
    CHECK_THAT(train_mdlm_fused(cfg, "x.toml", {}).status().message(),
               Catch::Contains("model.arch"));
    if (!make_fused_cuda_backend(0).ok()) {
      cfg = tiny_run(dir, "out");
      const auto rc = train_mdlm_fused(cfg, "x.toml", FusedTrainOptions{.cuda = true});
      REQUIRE_FALSE(rc.ok());
      CHECK_THAT(rc.status().message(), Catch::Contains("cuda", Catch::CaseSensitive::No));
    }
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE("fused MDLM steps are deterministic and overfit one batch", "[models][fused]") {
  const MdlmConfig c = tiny(true);
  auto m1 = make_fused(c, 2);
  auto m2 = make_fused(c, 2);
  const Tensor x0 = random_x0(2, 41);
  const FusedOptimizer opt{0.9, 0.99, 1e-8, 0.0};
  Rng r1(42), r2(42);
  // A fixed corruption to measure on, away from the training draws.
  Rng eval_rng(43);
  const Mdlm host(c, 1);
  const std::vector<double> te = {0.5, 0.7};
  const NoisedBatch nb = host.corrupt(x0, te, eval_rng);
  auto before = m1->loss(x0, nb.t, nb.xt);
  REQUIRE(before.ok());
  for (int i = 0; i < 150; ++i) {
    auto s1 = m1->train_step(x0, r1, 3e-3, opt, 1.0);
    REQUIRE(s1.ok());
    if (i < 3) {
      auto s2 = m2->train_step(x0, r2, 3e-3, opt, 1.0);
      REQUIRE(s2.ok());
      REQUIRE(s1->loss == s2->loss);
      REQUIRE(s1->grad_norm == s2->grad_norm);
    }
  }
  auto after = m1->loss(x0, nb.t, nb.xt);
  REQUIRE(after.ok());
  CHECK(*after < 0.5 * *before);
  CHECK(m1->trunk().steps() == 150);
}

}  // namespace
}  // namespace starling::models
