// DDPM: schedules against closed forms, the forward process, both samplers recovering a known
// image from an exact noise predictor, the U-Net's shapes and gradients, overfitting one batch,
// checkpoints, the PNG writer, the configs in configs/ and the classifier check.
#include "models/ddpm/ddpm.h"

#include <zlib.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <numbers>

#include "core/autograd/autograd.h"
#include "core/config/toml_config.h"
#include "core/data/data_dir.h"
#include "core/data/mnist.h"
#include "core/io/safetensors.h"
#include "core/ops/ops.h"
#include "core/optim/optimizer.h"
#include "core/wire/config.pb.h"
#include "models/ddpm/checkpoint.h"
#include "models/ddpm/png.h"
#include "models/ddpm/quality.h"
#include "tests/testing/test_data.h"

namespace starling::models {
namespace {

std::filesystem::path temp_path(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / "starling_ddpm_test";
  std::filesystem::create_directories(dir);
  return dir / name;
}

DdpmConfig tiny() {
  DdpmConfig c;
  c.unet.image_size = 8;
  c.unet.in_channels = 1;
  c.unet.base_channels = 8;
  c.unet.channel_mult = {1, 2};
  c.unet.num_res_blocks = 1;
  c.unet.groups = 4;
  c.unet.attention_heads = 2;
  c.schedule.timesteps = 50;
  c.sampler.steps = 10;
  c.num_samples = 4;
  return c;
}

TEST_CASE("ddpm schedules: linear and cosine against closed forms", "[ddpm]") {
  ScheduleConfig lc;
  const Schedule lin(lc);
  REQUIRE(lin.timesteps() == 1000);
  REQUIRE(lin.beta(0) == Approx(1e-4));
  REQUIRE(lin.beta(999) == Approx(0.02));
  REQUIRE(lin.alpha_bar(1) == Approx((1 - 1e-4) * (1 - lin.beta(1))));
  for (int64_t t = 1; t < 1000; ++t) REQUIRE(lin.alpha_bar(t) < lin.alpha_bar(t - 1));
  // Ho et al.: alpha_bar(T) is about 4e-5 for this schedule, so x_T is nearly pure noise.
  REQUIRE(lin.alpha_bar(999) == Approx(4.04e-5).epsilon(0.02));

  ScheduleConfig cc;
  cc.schedule = NoiseSchedule::kCosine;
  const Schedule cos(cc);
  auto f = [](double t) {
    const double v = std::cos((t / 1000.0 + 0.008) / 1.008 * std::numbers::pi / 2);
    return v * v;
  };
  for (int64_t t : {0, 10, 500, 900}) REQUIRE(cos.alpha_bar(t) == Approx(f(t + 1) / f(0)));
  REQUIRE(cos.beta(999) == Approx(0.999));  // clipped

  const auto seq = lin.respaced(10);
  REQUIRE(seq.size() == 10);
  REQUIRE(seq.front() == 0);
  REQUIRE(seq.back() == 999);
  REQUIRE(seq[1] == 111);
  REQUIRE(lin.respaced(1) == std::vector<int64_t>{999});
  REQUIRE(lin.respaced(1000).size() == 1000);
}

TEST_CASE("ddpm q_sample mixes image and noise per image", "[ddpm]") {
  const Schedule s(ScheduleConfig{});
  Rng rng(1);
  const Tensor x0 = Tensor::randn({2, 1, 3, 3}, rng), noise = Tensor::randn({2, 1, 3, 3}, rng);
  const Tensor xt = s.q_sample(x0, noise, {0, 700});
  const auto vx = x0.to_float_vector(), vn = noise.to_float_vector(), vt = xt.to_float_vector();
  for (int i = 0; i < 18; ++i) {
    const double ab = s.alpha_bar(i < 9 ? 0 : 700);
    REQUIRE(vt[i] == Approx(std::sqrt(ab) * vx[i] + std::sqrt(1 - ab) * vn[i]).margin(1e-6));
  }
}

TEST_CASE("ddpm samplers recover the image of an exact noise predictor", "[ddpm]") {
  // For data that is one image x*, the optimal predictor is eps(x_t, t) = (x_t - sqrt(ab_t) x*)
  // / sqrt(1 - ab_t); every sampler must then end at x*.
  const auto sched_kind = GENERATE(NoiseSchedule::kLinear, NoiseSchedule::kCosine);
  ScheduleConfig scfg;
  scfg.timesteps = 200;
  scfg.schedule = sched_kind;
  const Schedule s(scfg);
  Rng rng(7);
  const Tensor target = Tensor::uniform({1, 2, 4, 4}, rng, -0.9, 0.9);
  const auto tv = target.to_float_vector();
  EpsModel oracle = [&](const Tensor& x, const Tensor& t) {
    const auto xv = x.to_float_vector(), ts = t.to_float_vector();
    const int64_t per = x.numel() / x.size(0);
    std::vector<float> e(xv.size());
    for (int64_t i = 0; i < x.size(0); ++i) {
      const double ab = s.alpha_bar(static_cast<int64_t>(ts[static_cast<size_t>(i)]));
      for (int64_t j = 0; j < per; ++j) {
        e[i * per + j] =
            static_cast<float>((xv[i * per + j] - std::sqrt(ab) * tv[j]) / std::sqrt(1 - ab));
      }
    }
    return Tensor::from_vector(e, x.shape());
  };
  struct Case {
    DdpmSampler sampler;
    int64_t steps;
    double eta;
  };
  const auto c =
      GENERATE(Case{DdpmSampler::kDdim, 20, 0.0}, Case{DdpmSampler::kDdim, 7, 1.0},
               Case{DdpmSampler::kAncestral, 200, 0.0}, Case{DdpmSampler::kAncestral, 13, 0.0});
  SamplerConfig sc{c.sampler, c.steps, c.eta, false};
  int64_t calls = 0;
  const Tensor out = sample_images(oracle, s, sc, 3, 2, 4, 4, rng, [&](int64_t) { ++calls; });
  REQUIRE(calls == c.steps);
  REQUIRE(out.shape() == Shape{3, 2, 4, 4});
  const auto ov = out.to_float_vector();
  for (size_t i = 0; i < ov.size(); ++i) REQUIRE(ov[i] == Approx(tv[i % tv.size()]).margin(1e-3));
}

TEST_CASE("ddpm U-Net: shapes, names and gradients reach every parameter", "[ddpm]") {
  const DdpmConfig c = tiny();
  REQUIRE(c.validate().ok());
  UNet net(c.unet, 3);
  Rng rng(2);
  const Tensor x = Tensor::randn({2, 1, 8, 8}, rng);
  const Tensor t = Tensor::from_vector(std::vector<float>{3, 40}, {2});
  const Tensor y = net.forward(x, t);
  REQUIRE(y.shape() == x.shape());
  // Zero-initialized output convolution: the untrained net predicts zero noise.
  for (float v : y.to_float_vector()) REQUIRE(v == 0.0f);
  const auto names = net.named_parameters();
  REQUIRE(names.front().first == "temb.0.weight");
  bool has_attn = false;
  for (const auto& [n, p] : names) has_attn = has_attn || n == "mid.attn.qkv.weight";
  REQUIRE(has_attn);
  // Once the zero-initialized layers move, every parameter receives a gradient.
  for (auto [n, p] : names) {
    if (std::all_of(p.data<float>(), p.data<float>() + p.numel(), [](float v) { return v == 0; }) &&
        n.find("norm") == std::string::npos) {
      p.copy_from(Tensor::randn(p.shape(), rng, 0.05));
    }
  }
  autograd::backward(ops::mean(ops::square(net.forward(x, t))));
  for (const auto& [n, p] : names) {
    INFO(n);
    REQUIRE(p.grad().defined());
    double s = 0;
    for (float v : p.grad().to_float_vector()) s += std::fabs(v);
    REQUIRE(s > 0);
  }
}

TEST_CASE("ddpm config validation names the key", "[ddpm]") {
  DdpmConfig c = tiny();
  c.unet.groups = 3;
  REQUIRE_THAT(c.validate().message(), Catch::Contains("ddpm.groups"));
  c = tiny();
  c.unet.image_size = 9;
  REQUIRE_THAT(c.validate().message(), Catch::Contains("ddpm.image_size"));
  c = tiny();
  c.sampler.steps = 51;
  REQUIRE_THAT(c.validate().message(), Catch::Contains("ddpm.sampling_steps"));
  c = tiny();
  c.schedule.beta_end = 1.5;
  REQUIRE_THAT(c.validate().message(), Catch::Contains("ddpm.beta_start"));
}

TEST_CASE("ddpm overfits one batch", "[ddpm]") {
  DdpmConfig c = tiny();
  c.ema_decay = 0.0;
  Ddpm model(c, 5);
  Rng rng(9);
  const Tensor x0 = Tensor::uniform({4, 1, 8, 8}, rng, -1, 1);
  const Tensor noise = Tensor::randn(x0.shape(), rng);
  const std::vector<int64_t> t = {5, 15, 30, 45};
  optim::AdamW opt(optim::decay_matrices_only(model.net().parameters()),
                   optim::AdamWOptions{0.9, 0.99, 1e-8, 0.0});
  const double first = model.loss(x0, t, noise).item();
  double last = first;
  for (int i = 0; i < 150; ++i) {
    Tensor loss = model.loss(x0, t, noise);
    last = loss.item();
    autograd::backward(loss);
    opt.step(3e-3);
    opt.zero_grad();
  }
  INFO("first " << first << " last " << last);
  REQUIRE(first > 0.5);
  REQUIRE(last < 0.1 * first);
}

TEST_CASE("ddpm sampling from a network: shape, range, determinism", "[ddpm]") {
  DdpmConfig c = tiny();
  Ddpm model(c, 4);
  for (Tensor p : model.net().parameters()) {
    Rng r(static_cast<uint64_t>(p.numel()));
    p.copy_from(Tensor::randn(p.shape(), r, 0.1));
  }
  model.update_ema(0);  // decay 1/10: the EMA moves most of the way to the weights
  for (auto sampler : {DdpmSampler::kDdim, DdpmSampler::kAncestral}) {
    SamplerConfig sc = c.sampler;
    sc.sampler = sampler;
    Rng a(11), b(11);
    const Tensor s1 = model.sample(5, a, &sc), s2 = model.sample(5, b, &sc);
    REQUIRE(s1.shape() == Shape{5, 1, 8, 8});
    for (float v : s1.to_float_vector()) REQUIRE((std::isfinite(v) && v >= -1 && v <= 1));
    REQUIRE(max_abs_diff(s1, s2) == 0.0);
  }
}

TEST_CASE("ddpm checkpoint round trip and bad files", "[ddpm]") {
  const DdpmConfig c = tiny();
  v1::RunConfig cfg;
  REQUIRE(config::parse_toml(R"(
[model]
arch = "ddpm"
[ddpm]
image_size = 8
base_channels = 8
channel_mult = [1, 2]
groups = 4
attention_heads = 2
timesteps = 50
sampling_steps = 10
num_samples = 4
)",
                             "tiny.toml", &cfg)
              .ok());
  const DdpmConfig fc = DdpmConfig::from_proto(cfg);
  REQUIRE(fc.unet.channel_mult == c.unet.channel_mult);
  REQUIRE(fc.validate().ok());
  Ddpm model(fc, 6);
  Rng rng(3);
  for (Tensor p : model.net().parameters()) p.copy_from(Tensor::randn(p.shape(), rng, 0.1));
  model.update_ema(100);
  const auto path = temp_path("ckpt.safetensors");
  REQUIRE(save_ddpm_checkpoint(path, model, cfg, {7, 0.5, 0.25}).ok());
  auto loaded = load_ddpm_checkpoint(path);
  REQUIRE(loaded.ok());
  REQUIRE(loaded->info.iter == 7);
  REQUIRE(loaded->info.val_loss == Approx(0.25));
  const Tensor x = Tensor::randn({2, 1, 8, 8}, rng);
  const Tensor t = Tensor::from_vector(std::vector<float>{1, 30}, {2});
  autograd::NoGradGuard ng;
  REQUIRE(max_abs_diff(model.net().forward(x, t), loaded->model->net().forward(x, t)) == 0.0);
  Rng a(1), b(1);
  REQUIRE(max_abs_diff(model.sample(2, a), loaded->model->sample(2, b)) == 0.0);

  // Another format, missing weights, and a missing file each name the file.
  auto sd = model.checkpoint_state();
  REQUIRE(io::save_safetensors(path, sd, {{"format", "starling.gpt.v1"}}).ok());
  REQUIRE_THAT(load_ddpm_checkpoint(path).status().message(), Catch::Contains("format"));
  auto toml = config::to_toml(cfg);
  sd.pop_back();
  REQUIRE(io::save_safetensors(path, sd, {{"format", "starling.ddpm.v1"}, {"config", toml}}).ok());
  REQUIRE_THAT(load_ddpm_checkpoint(path).status().message(), Catch::Contains(path.string()));
  REQUIRE_FALSE(load_ddpm_checkpoint(temp_path("absent.safetensors")).ok());
}

// Reads back the PNG written by encode_png: chunk CRCs, IHDR and the inflated rows.
TEST_CASE("png encoder writes a valid file", "[ddpm]") {
  const int64_t w = 5, h = 3;
  std::vector<uint8_t> px(static_cast<size_t>(w * h));
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i * 17);
  auto png = encode_png(px, w, h, 1);
  REQUIRE(png.ok());
  const std::vector<uint8_t>& f = *png;
  REQUIRE(std::vector<uint8_t>(f.begin(), f.begin() + 8) ==
          std::vector<uint8_t>{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'});
  auto u32 = [&](size_t at) {
    return (uint32_t{f[at]} << 24) | (uint32_t{f[at + 1]} << 16) | (uint32_t{f[at + 2]} << 8) |
           f[at + 3];
  };
  size_t at = 8;
  std::vector<std::string> types;
  std::vector<uint8_t> idat;
  while (at < f.size()) {
    const uint32_t len = u32(at);
    const std::string type(f.begin() + static_cast<long>(at) + 4,
                           f.begin() + static_cast<long>(at) + 8);
    types.push_back(type);
    REQUIRE(crc32(0L, f.data() + at + 4, len + 4) == u32(at + 8 + len));
    if (type == "IHDR") {
      REQUIRE(u32(at + 8) == w);
      REQUIRE(u32(at + 12) == h);
      REQUIRE(f[at + 16] == 8);
      REQUIRE(f[at + 17] == 0);
    }
    if (type == "IDAT")
      idat.assign(f.begin() + static_cast<long>(at) + 8,
                  f.begin() + static_cast<long>(at + 8 + len));
    at += 12 + len;
  }
  REQUIRE(types == std::vector<std::string>{"IHDR", "IDAT", "IEND"});
  std::vector<uint8_t> raw(static_cast<size_t>((w + 1) * h));
  uLongf n = raw.size();
  REQUIRE(uncompress(raw.data(), &n, idat.data(), idat.size()) == Z_OK);
  REQUIRE(n == raw.size());
  for (int64_t y = 0; y < h; ++y) {
    REQUIRE(raw[y * (w + 1)] == 0);
    for (int64_t x = 0; x < w; ++x) REQUIRE(raw[y * (w + 1) + 1 + x] == px[y * w + x]);
  }
  REQUIRE_FALSE(encode_png(px, w, h, 2).ok());
  REQUIRE_FALSE(encode_png(px, w + 1, h, 1).ok());
  // A grid of two 2x2 images with one pixel of padding: 7 x 4 pixels, -1 -> 0 and 1 -> 255.
  const Tensor imgs =
      Tensor::from_vector(std::vector<float>{-1, 1, 1, -1, 0, 0, 0, 2}, {2, 1, 2, 2});
  auto grid = image_grid_png(imgs, 2, 1);
  REQUIRE(grid.ok());
  REQUIRE(u32(16) == 5);  // the first file's width is unchanged
  const std::vector<uint8_t>& g = *grid;
  REQUIRE(((uint32_t{g[16]} << 24) | (uint32_t{g[17]} << 16) | (uint32_t{g[18]} << 8) | g[19]) ==
          7);
  REQUIRE(((uint32_t{g[20]} << 24) | (uint32_t{g[21]} << 16) | (uint32_t{g[22]} << 8) | g[23]) ==
          4);
  REQUIRE_FALSE(image_grid_png(Tensor::zeros({2, 2}), 1).ok());
}

TEST_CASE("ddpm configs in configs/ load and validate", "[ddpm][config]") {
  for (const auto& e :
       std::filesystem::directory_iterator(std::string(STARLING_SOURCE_DIR) + "/configs")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("ddpm_", 0) != 0) continue;
    INFO(name);
    auto cfg = config::load_run_config(e.path());
    REQUIRE(cfg.ok());
    REQUIRE(config::validate_run_config(*cfg, name).ok());
    REQUIRE(cfg->model().arch() == v1::ModelConfig::DDPM);
    const DdpmConfig dc = DdpmConfig::from_proto(*cfg);
    INFO(dc.validate().message());
    REQUIRE(dc.validate().ok());
  }
}

TEST_CASE("classifier check: real digits are confident and spread over classes", "[ddpm]") {
  auto dir = data::resolve_data_dir("");
  REQUIRE(dir.ok());
  auto train = data::load_mnist_split(*dir, "mnist", true);
  auto test = data::load_mnist_split(*dir, "mnist", false);
  REQUIRE(train.ok());
  REQUIRE(test.ok());
  // 10000 training images, two epochs: enough for a confident, if rough, classifier. The
  // fixture cut (tests/testing/test_data.h) has 3000: six epochs of those.
  const int64_t n_train = std::min<int64_t>(10000, train->size());
  const int64_t epochs = n_train < 10000 ? 6 : 2;
  train->images.resize(static_cast<size_t>(n_train * 784));
  train->labels.resize(static_cast<size_t>(n_train));
  const int64_t n = 200;
  Tensor real = Tensor::uninitialized({n, 1, 28, 28});
  for (int64_t i = 0; i < n * 784; ++i) real.data<float>()[i] = test->images[i] * 2 - 1;
  auto q = classify_samples(real, *train, *test, epochs, 1);
  REQUIRE(q.ok());
  INFO(q->summary());
  REQUIRE(q->classifier_test_accuracy > 0.85);
  REQUIRE(q->sample_mean_max_prob > 0.8);
  REQUIRE(q->histogram_entropy_bits > 3.0);
  // Noise is not a digit: the classifier is much less sure of it.
  Rng rng(1);
  auto qn = classify_samples(Tensor::uniform({n, 1, 28, 28}, rng, -1, 1), *train, *test, epochs, 1);
  REQUIRE(qn.ok());
  REQUIRE(qn->sample_mean_max_prob < q->sample_mean_max_prob);
  REQUIRE_FALSE(classify_samples(Tensor::zeros({2, 1, 8, 8}), *train, *test, 1, 1).ok());
}

}  // namespace
}  // namespace starling::models
