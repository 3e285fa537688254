// MDLM / UDLM: corruption and loss weights on hand-checkable cases, SUBS, the UDLM integrand
// against the discrete-time KL, overfitting one batch, samplers and checkpoint round trips.
#include "models/mdlm/mdlm.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <limits>

#include "core/config/toml_config.h"
#include "core/data/char_tokenizer.h"
#include "core/ops/ops.h"
#include "core/optim/optimizer.h"
#include "core/wire/config.pb.h"
#include "models/gpt/checkpoint.h"
#include "models/mdlm/checkpoint.h"
#include "models/mdlm/trainer.h"

using starling::Rng;
using starling::Tensor;
namespace models = starling::models;
namespace ops = starling::ops;

namespace {
constexpr int64_t kV = 11, kT = 8;

models::MdlmConfig tiny(models::DiffusionNoise noise = models::DiffusionNoise::kAbsorbing) {
  models::MdlmConfig c;
  c.vocab_size = kV;
  c.block_size = kT;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.noise = noise;
  return c;
}

std::vector<int32_t> random_ids(int64_t n, int64_t v, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> x(static_cast<size_t>(n));
  for (auto& e : x) e = static_cast<int32_t>(rng.below(static_cast<uint64_t>(v)));
  return x;
}

std::vector<double> log_softmax_row(const float* row, int64_t n) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, static_cast<double>(row[j]));
  double s = 0.0;
  for (int64_t j = 0; j < n; ++j) s += std::exp(row[j] - mx);
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) out[j] = row[j] - mx - std::log(s);
  return out;
}

// Trains `m` for `steps` AdamW steps on two random sequences (ids from seed + 1) and returns its
// loss before and after on one fixed corruption at times `te` (drawn from seed + 2); training
// draws from seed + 3.
std::pair<double, double> overfit_one_batch(models::Mdlm& m, const std::vector<double>& te,
                                            uint64_t seed, int steps) {
  const Tensor x0 = Tensor::from_vector(random_ids(2 * kT, kV, seed + 1), {2, kT});
  Rng eval_rng(seed + 2);
  const auto nb = m.corrupt(x0, te, eval_rng);
  const double first = m.loss(x0, te, nb.xt).item();
  starling::optim::AdamW opt(starling::optim::decay_matrices_only(m.parameters()),
                             {0.9, 0.99, 1e-8, 0.0});
  Rng rng(seed + 3);
  for (int i = 0; i < steps; ++i) {
    Tensor loss = m.loss(x0, rng);
    starling::autograd::backward(loss);
    opt.step(3e-3);
    opt.zero_grad();
  }
  return {first, m.loss(x0, te, nb.xt).item()};
}

// The mean of `draws` training-loss draws m.loss(x0, rng) (fresh times and masks each) and the
// variance of that mean.
std::pair<double, double> monte_carlo_loss(const models::Mdlm& m, const Tensor& x0, int64_t draws,
                                           uint64_t seed) {
  Rng rng(seed);
  double s = 0.0, s2 = 0.0;
  for (int64_t d = 0; d < draws; ++d) {
    const double l = m.loss(x0, rng).item();
    s += l;
    s2 += l * l;
  }
  const double mean = s / static_cast<double>(draws);
  return {mean, (s2 / static_cast<double>(draws) - mean * mean) / static_cast<double>(draws)};
}

// tiny()'s shape as a `starling train` config (absorbing noise, learned positions).
starling::v1::RunConfig tiny_run_config() {
  starling::v1::RunConfig cfg;
  cfg.mutable_model()->set_arch(starling::v1::ModelConfig::MDLM);
  cfg.mutable_model()->set_block_size(kT);
  cfg.mutable_model()->set_n_layer(2);
  cfg.mutable_model()->set_n_head(2);
  cfg.mutable_model()->set_n_embd(16);
  cfg.mutable_model()->set_causal(false);
  return cfg;
}

std::filesystem::path temp_path(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / "starling_mdlm_test";
  std::filesystem::create_directories(dir);
  return dir / name;
}
}  // namespace

TEST_CASE("mdlm corruption follows the log-linear schedule, times are stratified", "[mdlm]") {
  for (auto noise : {models::DiffusionNoise::kAbsorbing, models::DiffusionNoise::kUniform}) {
    models::Mdlm m(tiny(noise), 1);
    const int64_t n = 40000;
    const Tensor x0 = Tensor::from_vector(random_ids(n, kV, 2), {1, n});
    Rng rng(3);
    const double t = 0.3;
    const auto nb = m.corrupt(x0, std::vector<double>{t}, rng);
    const auto* a = x0.data<int32_t>();
    const auto* z = nb.xt.data<int32_t>();
    int64_t changed = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (z[i] == a[i]) continue;
      ++changed;
      if (noise == models::DiffusionNoise::kAbsorbing) {
        REQUIRE(z[i] == m.mask_id());
      } else {
        REQUIRE((z[i] >= 0 && z[i] < kV));
      }
    }
    // P(changed) = 1 - alpha(t), times (1 - 1/V) for uniform noise (a jump may land on itself).
    double expect = (1.0 - 1e-3) * t;
    if (noise == models::DiffusionNoise::kUniform) expect *= 1.0 - 1.0 / kV;
    REQUIRE(static_cast<double>(changed) / n == Approx(expect).margin(0.01));
  }
  models::Mdlm m(tiny(), 1);
  Rng rng(4);
  const auto ts = m.sample_times(4, rng);
  for (int i = 0; i < 4; ++i) {
    REQUIRE(ts[i] >= 1e-3 + (1 - 1e-3) * i / 4.0);
    REQUIRE(ts[i] < 1e-3 + (1 - 1e-3) * (i + 1) / 4.0);
  }
}

TEST_CASE("mdlm loss is (1/t) * CE on masked positions per token, SUBS drops [MASK]", "[mdlm]") {
  models::Mdlm m(tiny(), 5);
  m.train(false);
  const auto x = random_ids(2 * kT, kV, 6);
  std::vector<int32_t> z = x;
  const int32_t mk = m.mask_id();
  for (int j : {0, 3, 4}) z[j] = mk;       // sequence 0: 3 masked
  for (int j : {8, 9, 12, 15}) z[j] = mk;  // sequence 1: 4 masked
  const Tensor x0 = Tensor::from_vector(x, {2, kT}), xt = Tensor::from_vector(z, {2, kT});
  const std::vector<double> t{0.25, 0.8};
  const double got = m.loss(x0, t, xt).item();

  starling::autograd::NoGradGuard ng;
  const Tensor subs = m.subs_logits(xt);
  REQUIRE(subs.shape() == starling::Shape{2, kT, kV + 1});
  const float* p = subs.data<float>();
  double want = 0.0;
  for (int64_t i = 0; i < 2 * kT; ++i) {
    const float* row = p + i * (kV + 1);
    REQUIRE(std::isinf(row[kV]));  // the [MASK] logit is -inf everywhere
    if (z[i] != mk) {
      // Unmasked: the input is copied (0 at the input, -inf elsewhere): no loss there.
      for (int64_t j = 0; j < kV; ++j) REQUIRE((j == z[i] ? row[j] == 0.0f : std::isinf(row[j])));
      continue;
    }
    const auto lp = log_softmax_row(row, kV);
    want += -lp[x[i]] / t[i / kT];
  }
  want /= 2.0 * kT;
  REQUIRE(got == Approx(want).epsilon(1e-5));

  // Nothing masked: no loss.
  REQUIRE(m.loss(x0, t, x0).item() == 0.0);
}

TEST_CASE("udlm integrand is the limit of the discrete-time KL, zero at the truth", "[mdlm]") {
  const int n = 5;
  const double eps = 1e-3, t = 0.4, h = 1e-6;
  auto alpha = [&](double u) { return 1.0 - (1.0 - eps) * u; };
  const std::vector<double> probs{0.1, 0.45, 0.2, 0.05, 0.2};
  for (int x0 = 0; x0 < n; x0 += 2) {
    for (int z = 0; z < n; ++z) {
      // q(z_s | z_t = z, x) for x one-hot and for x = probs, s = t - h.
      const double at = alpha(t), as = alpha(t - h), ats = at / as;
      auto post = [&](const std::vector<double>& xv) {
        std::vector<double> q(n);
        double s = 0.0;
        for (int y = 0; y < n; ++y) {
          q[y] = ((y == z ? ats : 0.0) + (1 - ats) / n) * (as * xv[y] + (1 - as) / n);
          s += q[y];
        }
        for (auto& e : q) e /= s;
        return q;
      };
      std::vector<double> onehot(n, 0.0);
      onehot[x0] = 1.0;
      const auto q = post(onehot), pq = post(probs);
      double kl = 0.0;
      for (int y = 0; y < n; ++y) kl += q[y] * std::log(q[y] / pq[y]);
      const double integrand = models::udlm_integrand(x0, z, probs, at, -(1 - eps));
      INFO("x0 " << x0 << " z " << z);
      REQUIRE(integrand >= 0.0);
      REQUIRE(kl / h == Approx(integrand).epsilon(1e-3));
      REQUIRE(models::udlm_integrand(x0, z, onehot, at, -(1 - eps)) == Approx(0.0).margin(1e-12));
    }
  }
}

TEST_CASE("udlm loss tensor matches the float64 integrand", "[mdlm]") {
  models::Mdlm m(tiny(models::DiffusionNoise::kUniform), 7);
  m.train(false);
  const Tensor x0 = Tensor::from_vector(random_ids(3 * kT, kV, 8), {3, kT});
  const std::vector<double> t{0.1, 0.5, 0.9};
  Rng rng(9);
  const auto nb = m.corrupt(x0, t, rng);
  const double got = m.loss(x0, t, nb.xt).item();
  starling::autograd::NoGradGuard ng;
  const Tensor logits = m.forward(nb.xt);
  const float* p = logits.data<float>();
  double want = 0.0;
  for (int64_t i = 0; i < 3 * kT; ++i) {
    auto lp = log_softmax_row(p + i * kV, kV);
    for (auto& e : lp) e = std::exp(e);
    const double a = m.config().alpha(t[i / kT]);
    want += models::udlm_integrand(x0.data<int32_t>()[i], nb.xt.data<int32_t>()[i], lp, a,
                                   m.config().dalpha());
  }
  want /= 3.0 * kT;
  REQUIRE(got == Approx(want).epsilon(1e-4));
}

TEST_CASE("a tiny mdlm overfits one batch", "[mdlm]") {
  auto noise = GENERATE(models::DiffusionNoise::kAbsorbing, models::DiffusionNoise::kUniform);
  models::Mdlm m(tiny(noise), 10);
  // A fixed evaluation: the same times and corruption before and after.
  const auto [first, last] = overfit_one_batch(m, {0.3, 0.7}, 10, 400);
  INFO("first " << first << " last " << last);
  // Under uniform noise even a model that has memorized the batch cannot always tell which
  // tokens are corrupted at t = 0.7, so its floor is higher.
  REQUIRE(last < (noise == models::DiffusionNoise::kAbsorbing ? 0.1 : 0.5) * first);
}

TEST_CASE("mdlm samplers: length T ids below V, cached equals uncached with fewer calls",
          "[mdlm]") {
  auto noise = GENERATE(models::DiffusionNoise::kAbsorbing, models::DiffusionNoise::kUniform);
  models::Mdlm m(tiny(noise), 14);
  const int64_t steps = 64;
  Rng r1(15), r2(15);
  models::SampleStats s1, s2;
  const auto a = m.sample(2, steps, 1.0, false, r1, &s1);
  const auto b = m.sample(2, steps, 1.0, true, r2, &s2);
  REQUIRE(a.size() == static_cast<size_t>(2 * kT));
  for (int32_t id : a) REQUIRE((id >= 0 && id < kV));  // no [MASK] (= V) left
  REQUIRE(a == b);
  REQUIRE(s1.network_calls == steps);
  REQUIRE(s2.network_calls + s2.cached_steps == steps);
  if (noise == models::DiffusionNoise::kAbsorbing) {
    // 16 tokens revealed over 64 steps: at most 16 steps change anything.
    REQUIRE(s2.network_calls <= 17);
  }
  REQUIRE(m.training());  // sampling restores the mode
}

TEST_CASE("mdlm checkpoint round trip gives identical outputs and samples", "[mdlm]") {
  starling::v1::RunConfig cfg = tiny_run_config();
  cfg.mutable_diffusion()->set_sampling_steps(16);
  auto tok = starling::data::CharTokenizer::from_corpus("hello world\n");
  REQUIRE(tok.ok());
  const auto mc = models::MdlmConfig::from_proto(cfg, tok->vocab_size());
  REQUIRE(mc.validate().ok());
  models::Mdlm m(mc, 21);
  REQUIRE(m.named_parameters().front().first == "transformer.wte.weight");
  REQUIRE(m.transformer->wte->weight.shape()[0] == tok->vocab_size() + 1);
  const auto path = temp_path("ckpt.safetensors");
  REQUIRE(models::save_mdlm_checkpoint(path, m, cfg, *tok, {3, 2.0, 2.1}).ok());
  auto loaded = models::load_mdlm_checkpoint(path);
  REQUIRE(loaded.ok());
  REQUIRE(loaded->info.iter == 3);
  const Tensor in = Tensor::from_vector(std::vector<int32_t>{1, 2, m.mask_id(), 4}, {1, 4});
  REQUIRE(starling::max_abs_diff(m.forward(in), loaded->model->forward(in)) == 0.0);
  Rng r1(5), r2(5);
  REQUIRE(m.sample(1, 16, 0.8, true, r1) == loaded->model->sample(1, 16, 0.8, true, r2));

  auto text = models::sample_mdlm_checkpoint(path, 0, 1.0, 7, 2);
  REQUIRE(text.ok());
  REQUIRE(text->size() == static_cast<size_t>(2 * kT + 5));

  // A GPT checkpoint is refused by format; a truncated file is an error naming it.
  starling::v1::RunConfig gcfg = cfg;
  gcfg.mutable_model()->set_arch(starling::v1::ModelConfig::GPT);
  models::Gpt g(models::GptConfig::from_proto(gcfg.model(), tok->vocab_size()), 1);
  const auto gpath = temp_path("gpt.safetensors");
  REQUIRE(models::save_gpt_checkpoint(gpath, g, gcfg, *tok, {}).ok());
  auto bad = models::load_mdlm_checkpoint(gpath);
  REQUIRE_FALSE(bad.ok());
  REQUIRE_THAT(bad.status().message(), Catch::Contains("starling.mdlm.v1"));
  const auto corrupt = temp_path("corrupt.safetensors");
  std::filesystem::copy_file(path, corrupt, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::resize_file(corrupt, std::filesystem::file_size(corrupt) / 2);
  auto c = models::load_mdlm_checkpoint(corrupt);
  REQUIRE_FALSE(c.ok());
  REQUIRE_THAT(c.status().message(), Catch::Contains("corrupt.safetensors"));
}

TEST_CASE("mdlm evaluation is deterministic", "[mdlm]") {
  models::Mdlm m(tiny(), 30);
  const auto tokens = random_ids(200, kV, 31);
  const double a = models::mdlm_eval_nelbo(m, tokens, 10, 4, 99);
  const double b = models::mdlm_eval_nelbo(m, tokens, 10, 4, 99);
  REQUIRE(a == b);
  REQUIRE(a > 0.0);
  REQUIRE(m.training());
}

TEST_CASE("mdlm learns to read bidirectional context", "[mdlm]") {
  // Each sequence repeats one random token; only the last position is left unmasked, so
  // predicting the others needs attention to a later position.
  models::Mdlm m(tiny(), 40);
  starling::optim::AdamW opt(starling::optim::decay_matrices_only(m.parameters()),
                             {0.9, 0.99, 1e-8, 0.0});
  Rng rng(41);
  const int64_t b = 8;
  auto make = [&](std::vector<int32_t>& x, std::vector<int32_t>& z) {
    x.assign(static_cast<size_t>(b * kT), 0);
    z.assign(static_cast<size_t>(b * kT), m.mask_id());
    for (int64_t i = 0; i < b; ++i) {
      const auto v = static_cast<int32_t>(rng.below(kV));
      for (int64_t j = 0; j < kT; ++j) x[i * kT + j] = v;
      z[i * kT + kT - 1] = v;
    }
  };
  const std::vector<double> t(static_cast<size_t>(b), 1.0);
  std::vector<int32_t> x, z;
  double last = 0.0;
  for (int it = 0; it < 300; ++it) {
    make(x, z);
    Tensor loss = m.loss(Tensor::from_vector(x, {b, kT}), t, Tensor::from_vector(z, {b, kT}));
    last = loss.item();
    starling::autograd::backward(loss);
    opt.step(3e-3);
    opt.zero_grad();
  }
  // Without context the floor is (7/8) ln 11 = 2.1 nats per token.
  INFO("last " << last);
  REQUIRE(last < 0.2);
}

TEST_CASE("a tiny mdlm with rope has no wpe, reads both directions and overfits one batch",
          "[mdlm][rope]") {
  models::MdlmConfig c = tiny();
  c.rope = true;
  models::Mdlm m(c, 50);
  REQUIRE(m.transformer->wpe == nullptr);
  for (const auto& [name, p] : m.named_parameters()) REQUIRE(name != "transformer.wpe.weight");
  // Bidirectional: changing the last token changes the first position's logits.
  m.train(false);
  const Tensor a = m.forward(Tensor::from_vector(std::vector<int32_t>{1, 11, 3, 4}, {1, 4}));
  const Tensor b = m.forward(Tensor::from_vector(std::vector<int32_t>{1, 11, 3, 5}, {1, 4}));
  REQUIRE(starling::max_abs_diff(a.slice(1, 0, 1), b.slice(1, 0, 1)) > 0.0);
  // Memorizing random sequences needs absolute positions, which RoPE gives only indirectly (through
  // the window's edges and the visible tokens): it takes ~3x the steps of learned positions.
  m.train(true);
  const auto [first, last] = overfit_one_batch(m, {0.3, 0.7}, 50, 1500);
  INFO("first " << first << " last " << last);
  REQUIRE(last < 0.1 * first);
}

TEST_CASE("mdlm checkpoint with rope round trips and samples", "[mdlm][rope]") {
  starling::v1::RunConfig cfg = tiny_run_config();
  cfg.mutable_model()->set_pos_encoding(starling::v1::ModelConfig::ROPE);
  cfg.mutable_model()->set_rope_base(100.0f);
  cfg.mutable_diffusion()->set_sampling_steps(16);
  auto tok = starling::data::CharTokenizer::from_corpus("hello world\n");
  REQUIRE(tok.ok());
  const auto mc = models::MdlmConfig::from_proto(cfg, tok->vocab_size());
  REQUIRE(mc.rope);
  REQUIRE(mc.rope_base == 100.0);
  REQUIRE(mc.trunk_config().rope);
  REQUIRE(mc.validate().ok());
  models::Mdlm m(mc, 22);
  const auto path = temp_path("rope_ckpt.safetensors");
  REQUIRE(models::save_mdlm_checkpoint(path, m, cfg, *tok, {5, 2.0, 2.1}).ok());
  auto loaded = models::load_mdlm_checkpoint(path);
  REQUIRE(loaded.ok());
  REQUIRE(loaded->model->config().rope);
  REQUIRE(loaded->model->config().rope_base == 100.0);
  const Tensor in = Tensor::from_vector(std::vector<int32_t>{1, m.mask_id(), 3, 4}, {1, 4});
  REQUIRE(starling::max_abs_diff(m.forward(in), loaded->model->forward(in)) == 0.0);
  Rng r1(5), r2(5);
  REQUIRE(m.sample(1, 16, 0.8, true, r1) == loaded->model->sample(1, 16, 0.8, true, r2));
  auto text = models::sample_mdlm_checkpoint(path, 0, 1.0, 7, 2);
  REQUIRE(text.ok());
  REQUIRE(text->size() == static_cast<size_t>(2 * kT + 5));
  // The same weights under a learned-position config miss wpe, named in the error.
  models::MdlmConfig learned = mc;
  learned.rope = false;
  models::Mdlm l(learned, 22);
  REQUIRE_THAT(l.load(m.state_dict()).message(), Catch::Contains("transformer.wpe.weight"));
}

TEST_CASE("count masking: k masked positions per sequence, t = k / T, loss = mean masked CE",
          "[mdlm]") {
  models::MdlmConfig c = tiny();
  c.masking = models::MaskSampling::kCount;
  REQUIRE(c.validate().ok());
  models::Mdlm m(c, 60);
  const int64_t b = 16;
  const Tensor x0 = Tensor::from_vector(random_ids(b * kT, kV, 61), {b, kT});
  Rng rng(62);
  const auto nb = m.corrupt_count(x0, rng);
  const auto x = x0.to_double_vector();
  const int32_t* z = nb.xt.data<int32_t>();
  // Stratified counts: sequence i has k in [1 + floor(T i / B), 1 + floor(T (i + 1) / B)].
  for (int64_t i = 0; i < b; ++i) {
    int64_t k = 0;
    for (int64_t j = 0; j < kT; ++j) {
      if (z[i * kT + j] == m.mask_id()) {
        ++k;
      } else {
        REQUIRE(z[i * kT + j] == static_cast<int32_t>(x[i * kT + j]));
      }
    }
    REQUIRE(k >= 1 + (kT * i) / b);
    REQUIRE(k <= std::min<int64_t>(kT, 1 + (kT * (i + 1)) / b));
    REQUIRE(nb.t[i] == static_cast<double>(k) / kT);
  }
  // The loss is the mean over sequences of the mean CE over masked positions.
  m.train(false);
  const Tensor logits = m.forward(nb.xt);
  double expected = 0.0;
  for (int64_t i = 0; i < b; ++i) {
    double sum = 0.0;
    int64_t k = 0;
    for (int64_t j = 0; j < kT; ++j) {
      if (z[i * kT + j] != m.mask_id()) continue;
      const auto ls = log_softmax_row(logits.data<float>() + (i * kT + j) * kV, kV);
      sum -= ls[static_cast<size_t>(x[i * kT + j])];
      ++k;
    }
    expected += sum / static_cast<double>(k) / static_cast<double>(b);
  }
  REQUIRE(m.loss(x0, nb.t, nb.xt).item() == Approx(expected).epsilon(1e-5));

  // Uniform noise has no masks to count.
  models::MdlmConfig u = tiny(models::DiffusionNoise::kUniform);
  u.masking = models::MaskSampling::kCount;
  REQUIRE_THAT(u.validate().message(), Catch::Contains("diffusion.masking"));
}

TEST_CASE("count and bernoulli masking estimate the same NELBO", "[mdlm]") {
  // Monte Carlo means of the two estimators for one fixed model agree within their standard
  // errors (eps = 1e-4 makes the Bernoulli form's eps -> 0 limit exact to 1e-4).
  models::MdlmConfig c = tiny();
  c.eps = 1e-4;
  models::Mdlm bern(c, 70);
  c.masking = models::MaskSampling::kCount;
  models::Mdlm count(c, 70);
  bern.train(false);
  count.train(false);
  starling::autograd::NoGradGuard ng;
  const int64_t b = 64;
  const Tensor x0 = Tensor::from_vector(random_ids(b * kT, kV, 71), {b, kT});
  const auto [mb, vb] = monte_carlo_loss(bern, x0, 200, 72);
  const auto [mc, vc] = monte_carlo_loss(count, x0, 20, 73);
  INFO("bernoulli " << mb << " (var of mean " << vb << "), count " << mc << " (" << vc << ")");
  REQUIRE(std::fabs(mb - mc) < 4.0 * std::sqrt(vb + vc));
  REQUIRE(vc * 20 < vb * 200 / 100);  // per batch: 100x lower variance, the point of counting
}

// Block diffusion (BD3-LM): blocks of L' tokens, each a masked diffusion given the clean blocks
// before it.
namespace {
models::MdlmConfig tiny_blocks(int64_t block_length, bool rope) {
  models::MdlmConfig c = tiny();
  c.block_length = block_length;
  c.rope = rope;
  return c;
}
}  // namespace

TEST_CASE("block diffusion: a noisy block sees itself and the clean blocks before it only",
          "[mdlm][bd3]") {
  const bool rope = GENERATE(false, true);
  models::Mdlm m(tiny_blocks(2, rope), 80);  // T = 8: 4 blocks of 2
  REQUIRE(m.config().block_diffusion());
  REQUIRE(m.config().num_blocks() == 4);
  m.train(false);
  const Tensor x0 = Tensor::from_vector(random_ids(kT, kV, 81), {1, kT});
  Tensor xt = x0.clone();
  for (int64_t j : {0, 3, 4, 5, 7}) xt.data<int32_t>()[j] = m.mask_id();
  const Tensor base = m.forward(xt, x0);
  REQUIRE(base.shape() == starling::Shape{1, kT, kV});
  auto block_diff = [&](const Tensor& a, int64_t blk) {
    return starling::max_abs_diff(a.slice(1, 2 * blk, 2 * blk + 2),
                                  base.slice(1, 2 * blk, 2 * blk + 2));
  };
  // Changing clean block 2 (positions 4, 5) moves the logits of noisy block 3 only.
  Tensor x0b = x0.clone();
  x0b.data<int32_t>()[4] = (x0b.data<int32_t>()[4] + 1) % kV;
  x0b.data<int32_t>()[5] = (x0b.data<int32_t>()[5] + 1) % kV;
  const Tensor c1 = m.forward(xt, x0b);
  for (int64_t blk = 0; blk < 3; ++blk) REQUIRE(block_diff(c1, blk) == 0.0);
  REQUIRE(block_diff(c1, 3) > 1e-6);
  // Changing a noisy token of block 1 (position 2) moves block 1's logits only.
  Tensor xtb = xt.clone();
  xtb.data<int32_t>()[2] = m.mask_id();
  const Tensor c2 = m.forward(xtb, x0);
  REQUIRE(block_diff(c2, 0) == 0.0);
  REQUIRE(block_diff(c2, 1) > 1e-6);
  REQUIRE(block_diff(c2, 2) == 0.0);
  REQUIRE(block_diff(c2, 3) == 0.0);
}

TEST_CASE("block diffusion: training logits equal the sampler's prefix logits", "[mdlm][bd3]") {
  const bool rope = GENERATE(false, true);
  models::Mdlm m(tiny_blocks(2, rope), 82);
  m.train(false);
  const int64_t b = 3;
  const Tensor x0 = Tensor::from_vector(random_ids(b * kT, kV, 83), {b, kT});
  Rng rng(84);
  const auto noised = m.corrupt(x0, m.sample_times(b * 4, rng), rng);
  const Tensor train_logits = m.forward(noised.xt, x0);
  // Block k of the sampler's layout: x0's blocks before k, then x_t's block k.
  for (int64_t blk = 0; blk < 4; ++blk) {
    const int64_t hi = 2 * (blk + 1);
    std::vector<int32_t> prefix(static_cast<size_t>(b * hi));
    for (int64_t i = 0; i < b; ++i) {
      for (int64_t j = 0; j < hi; ++j) {
        const Tensor& src = j < 2 * blk ? x0 : noised.xt;
        prefix[static_cast<size_t>(i * hi + j)] = src.data<int32_t>()[i * kT + j];
      }
    }
    const Tensor pl = m.prefix_forward(Tensor::from_vector(prefix, {b, hi}));
    INFO("block " << blk);
    REQUIRE(starling::max_abs_diff(pl.slice(1, hi - 2, hi), train_logits.slice(1, hi - 2, hi)) <
            1e-5);
  }
}

TEST_CASE("block diffusion with blocks of one token is an autoregressive model", "[mdlm][bd3]") {
  // Count masking masks the one token of every block (k = 1, t = 1): the loss is the mean
  // next-token cross-entropy given the clean prefix, whatever the random draws.
  models::MdlmConfig c = tiny_blocks(1, true);
  c.masking = models::MaskSampling::kCount;
  models::Mdlm m(c, 85);
  m.train(false);
  const int64_t b = 2;
  const Tensor x0 = Tensor::from_vector(random_ids(b * kT, kV, 86), {b, kT});
  Rng r1(1), r2(2);
  const double l1 = m.loss(x0, r1).item(), l2 = m.loss(x0, r2).item();
  REQUIRE(l1 == Approx(l2).epsilon(1e-6));
  double expected = 0.0;
  for (int64_t j = 0; j < kT; ++j) {
    std::vector<int32_t> prefix(static_cast<size_t>(b * (j + 1)));
    for (int64_t i = 0; i < b; ++i) {
      for (int64_t p = 0; p < j; ++p) prefix[i * (j + 1) + p] = x0.data<int32_t>()[i * kT + p];
      prefix[i * (j + 1) + j] = m.mask_id();
    }
    const Tensor pl = m.prefix_forward(Tensor::from_vector(prefix, {b, j + 1})).contiguous();
    for (int64_t i = 0; i < b; ++i) {
      const auto ls = log_softmax_row(pl.data<float>() + (i * (j + 1) + j) * kV, kV);
      expected -= ls[static_cast<size_t>(x0.data<int32_t>()[i * kT + j])] / (b * kT);
    }
  }
  REQUIRE(l1 == Approx(expected).epsilon(1e-5));
}

TEST_CASE("block diffusion corruption: one time per block, count masking per block",
          "[mdlm][bd3]") {
  models::MdlmConfig c = tiny_blocks(4, false);  // 2 blocks of 4
  models::Mdlm m(c, 87);
  const int64_t b = 50;
  const Tensor x0 = Tensor::from_vector(random_ids(b * kT, kV, 88), {b, kT});
  // Bernoulli: block 0 at t = 1 (all masked, up to eps), block 1 at t ~ 0 (none masked).
  std::vector<double> t;
  for (int64_t i = 0; i < b; ++i) t.insert(t.end(), {1.0, 1e-9});
  Rng rng(89);
  const auto nb = m.corrupt(x0, t, rng);
  int64_t masked0 = 0, masked1 = 0;
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t j = 0; j < kT; ++j) {
      const bool masked = nb.xt.data<int32_t>()[i * kT + j] == m.mask_id();
      (j < 4 ? masked0 : masked1) += masked ? 1 : 0;
    }
  }
  REQUIRE(masked0 >= b * 4 - 2);
  REQUIRE(masked1 == 0);
  // Count: every block has k in [1, 4] masked tokens and t = k / 4.
  c.masking = models::MaskSampling::kCount;
  models::Mdlm mc(c, 87);
  const auto cb = mc.corrupt_count(x0, rng);
  REQUIRE(cb.t.size() == static_cast<size_t>(2 * b));
  for (int64_t u = 0; u < 2 * b; ++u) {
    int64_t k = 0;
    for (int64_t j = 0; j < 4; ++j) {
      k += cb.xt.data<int32_t>()[(u / 2) * kT + (u % 2) * 4 + j] == mc.mask_id() ? 1 : 0;
    }
    REQUIRE(k >= 1);
    REQUIRE(cb.t[u] == static_cast<double>(k) / 4.0);
  }
}

TEST_CASE("block diffusion: configuration errors name diffusion.block_length", "[mdlm][bd3]") {
  models::MdlmConfig c = tiny_blocks(3, false);  // does not divide T = 8
  REQUIRE_THAT(c.validate().message(), Catch::Contains("diffusion.block_length"));
  c.block_length = -1;
  REQUIRE_THAT(c.validate().message(), Catch::Contains("diffusion.block_length"));
  c = tiny_blocks(2, false);
  c.noise = models::DiffusionNoise::kUniform;
  REQUIRE_THAT(c.validate().message(), Catch::Contains("absorbing"));
  // block_length = T is plain MDLM.
  c = tiny_blocks(kT, false);
  REQUIRE(c.validate().ok());
  REQUIRE_FALSE(c.block_diffusion());
  REQUIRE(c.num_blocks() == 1);
}

TEST_CASE("block diffusion overfits one batch and samples block by block", "[mdlm][bd3]") {
  models::Mdlm m(tiny_blocks(2, true), 90);
  // One time per block: 2 sequences x 4 blocks.
  const auto [first, last] =
      overfit_one_batch(m, {0.3, 0.7, 0.5, 0.9, 0.2, 0.6, 0.8, 0.4}, 90, 300);
  INFO("first " << first << " last " << last);
  // A fully masked first block cannot tell the two memorized sequences apart (it sees no clean
  // context), so the floor is above the plain MDLM's.
  REQUIRE(last < 0.2 * first);

  const int64_t steps = 8;
  Rng r1(94), r2(94);
  models::SampleStats s1, s2;
  const auto a = m.sample(3, steps, 1.0, false, r1, &s1);
  const auto b = m.sample(3, steps, 1.0, true, r2, &s2);
  REQUIRE(a.size() == static_cast<size_t>(3 * kT));
  for (int32_t id : a) REQUIRE((id >= 0 && id < kV));
  REQUIRE(a == b);
  REQUIRE(s1.network_calls == 4 * steps);  // 4 blocks, `steps` each
  REQUIRE(s2.network_calls + s2.cached_steps == 4 * steps);
  REQUIRE(s2.network_calls < s1.network_calls);
  REQUIRE(m.training());
}

TEST_CASE("block diffusion checkpoints keep the block length, evaluation is deterministic",
          "[mdlm][bd3]") {
  starling::v1::RunConfig cfg = tiny_run_config();
  cfg.mutable_model()->set_pos_encoding(starling::v1::ModelConfig::ROPE);
  cfg.mutable_diffusion()->set_block_length(4);
  cfg.mutable_diffusion()->set_sampling_steps(4);
  auto tok = starling::data::CharTokenizer::from_corpus("hello world\n");
  REQUIRE(tok.ok());
  const auto mc = models::MdlmConfig::from_proto(cfg, tok->vocab_size());
  REQUIRE(mc.block_length == 4);
  models::Mdlm m(mc, 95);
  const auto path = temp_path("bd3.safetensors");
  REQUIRE(models::save_mdlm_checkpoint(path, m, cfg, *tok, {1, 2.0, 2.1}).ok());
  auto loaded = models::load_mdlm_checkpoint(path);
  REQUIRE(loaded.ok());
  REQUIRE(loaded->model->config().block_length == 4);
  Rng r1(5), r2(5);
  REQUIRE(m.sample(2, 4, 0.8, true, r1) == loaded->model->sample(2, 4, 0.8, true, r2));
  const auto tokens = random_ids(200, tok->vocab_size(), 96);
  const double a = models::mdlm_eval_nelbo(m, tokens, 10, 4, 99);
  REQUIRE(a == models::mdlm_eval_nelbo(*loaded->model, tokens, 10, 4, 99));
  REQUIRE(a > 0.0);
}

TEST_CASE("antithetic masks: complement plus one per block, the same NELBO in expectation",
          "[mdlm]") {
  const int64_t block_length = GENERATE(0, 2);
  models::MdlmConfig c = tiny_blocks(block_length, false);
  c.masking = models::MaskSampling::kCount;
  c.eps = 1e-4;
  models::Mdlm plain(c, 100);
  c.antithetic = true;
  REQUIRE(c.validate().ok());
  models::Mdlm anti(c, 100);
  const int64_t b = 16, nb = anti.config().num_blocks(), bl = kT / nb;
  const Tensor x0 = Tensor::from_vector(random_ids(b * kT, kV, 101), {b, kT});
  Rng rng(102);
  const auto first = anti.corrupt_count(x0, rng);
  const auto pair = anti.antithetic_pair(first, x0, rng);
  REQUIRE(pair.xt.shape() == starling::Shape{2 * b, kT});
  REQUIRE(pair.t.size() == static_cast<size_t>(2 * b * nb));
  const int32_t* z = pair.xt.data<int32_t>();
  const int32_t* x = x0.data<int32_t>();
  for (int64_t u = 0; u < b * nb; ++u) {
    const int64_t base = (u / nb) * kT + (u % nb) * bl;
    int64_t k1 = 0, k2 = 0, both = 0;
    for (int64_t j = 0; j < bl; ++j) {
      const bool m1 = z[base + j] == anti.mask_id(), m2 = z[b * kT + base + j] == anti.mask_id();
      k1 += m1;
      k2 += m2;
      both += m1 && m2;
      if (!m2) REQUIRE(z[b * kT + base + j] == x[base + j]);
      REQUIRE((m1 || m2));  // every token is a target in one of the two
    }
    REQUIRE(both == 1);
    REQUIRE(k2 == bl + 1 - k1);
    REQUIRE(pair.t[b * nb + u] == static_cast<double>(k2) / static_cast<double>(bl));
  }
  // Monte Carlo: the antithetic loss estimates the count estimator's NELBO.
  plain.train(false);
  anti.train(false);
  starling::autograd::NoGradGuard ng;
  const auto [mp, vp] = monte_carlo_loss(plain, x0, 60, 103);
  const auto [ma, va] = monte_carlo_loss(anti, x0, 30, 104);
  INFO("count " << mp << " (" << vp << "), antithetic " << ma << " (" << va << ")");
  REQUIRE(std::fabs(mp - ma) < 4.0 * std::sqrt(vp + va) + 1e-6);

  models::MdlmConfig bad = tiny();
  bad.antithetic = true;  // bernoulli masking
  REQUIRE_THAT(bad.validate().message(), Catch::Contains("diffusion.antithetic"));
}

TEST_CASE("mdlm configs in configs/ load and validate", "[mdlm][config]") {
  int found = 0;
  for (const auto& e :
       std::filesystem::directory_iterator(std::string(STARLING_SOURCE_DIR) + "/configs")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("mdlm_", 0) != 0) continue;
    INFO(name);
    auto cfg = starling::config::load_run_config(e.path());
    REQUIRE(cfg.ok());
    REQUIRE(starling::config::validate_run_config(*cfg, name).ok());
    REQUIRE(cfg->model().arch() == starling::v1::ModelConfig::MDLM);
    const auto mc = models::MdlmConfig::from_proto(*cfg, 65);
    INFO(mc.validate().message());
    REQUIRE(mc.validate().ok());
    if (name == "mdlm_char_bd3_cpu.toml") {
      CHECK(mc.block_diffusion());
      CHECK(mc.block_length == 2);
      CHECK(mc.antithetic);
    }
    ++found;
  }
  REQUIRE(found >= 3);
}
