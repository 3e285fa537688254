// train_ddpm: train_gpt's loop shape over MNIST-style images with the epsilon objective.
#include "models/ddpm/trainer.h"

#include <omp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>

#include "core/autograd/autograd.h"
#include "core/config/toml_config.h"
#include "core/data/data_dir.h"
#include "core/data/mnist.h"
#include "core/optim/optimizer.h"
#include "models/ddpm/checkpoint.h"
#include "models/ddpm/png.h"
#include "models/ddpm/quality.h"

namespace starling::models {

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kEvalSeed = 0x5eed;  // every run evaluates on the same steps and noise

std::string format_eta(double seconds) {
  const auto s = static_cast<int64_t>(seconds);
  return fmt::format("{}:{:02d}", s / 60, s % 60);
}

// An MNIST-style split as (N, 1, H, W) f32 scaled to [-1, 1].
Tensor to_model_space(const data::MnistSet& set) {
  Tensor t = Tensor::uninitialized({set.size(), 1, set.rows, set.cols});
  float* p = t.data<float>();
  for (size_t i = 0; i < set.images.size(); ++i) p[i] = set.images[i] * 2.0f - 1.0f;
  return t;
}

Tensor gather(const Tensor& images, const std::vector<int64_t>& idx) {
  const int64_t per = images.numel() / images.size(0);
  Shape s = images.shape();
  s[0] = static_cast<int64_t>(idx.size());
  Tensor out = Tensor::uninitialized(s);
  const float* src = images.data<float>();
  float* dst = out.data<float>();
  for (size_t i = 0; i < idx.size(); ++i) {
    std::memcpy(dst + static_cast<int64_t>(i) * per, src + idx[i] * per,
                static_cast<size_t>(per) * sizeof(float));
  }
  return out;
}

Result<data::MnistSet> load_images(const std::string& data_dir_cfg, const std::string& dataset,
                                   bool train, const std::string& where) {
  ASSIGN_OR_RETURN(auto data_dir, data::resolve_data_dir(data_dir_cfg), where + ": data.data_dir");
  if (dataset != "mnist" && dataset != "fashion-mnist") {
    return invalid_argument(where + ": key 'data.dataset' = \"" + dataset +
                            "\": the DDPM trains on \"mnist\" or \"fashion-mnist\"");
  }
  return data::load_mnist_split(data_dir, dataset, train);
}

}  // namespace

double ddpm_eval_loss(Ddpm& model, const Tensor& images, int64_t num, int64_t batch,
                      uint64_t seed) {
  autograd::NoGradGuard ng;
  const bool was_training = model.net().training();
  model.net().train(false);
  const int64_t n = images.size(0);
  num = std::min(num, n);
  Rng rng(seed);
  double total = 0.0;
  for (int64_t s0 = 0; s0 < num; s0 += batch) {
    const int64_t b = std::min(batch, num - s0);
    std::vector<int64_t> idx(static_cast<size_t>(b)), t(static_cast<size_t>(b));
    for (int64_t i = 0; i < b; ++i) {
      idx[static_cast<size_t>(i)] = num > 1 ? (s0 + i) * (n - 1) / (num - 1) : 0;
      t[static_cast<size_t>(i)] =
          static_cast<int64_t>(rng.below(static_cast<uint64_t>(model.schedule().timesteps())));
    }
    const Tensor x0 = gather(images, idx);
    const Tensor noise = Tensor::randn(x0.shape(), rng);
    total += model.loss(x0, t, noise).item() * static_cast<double>(b);
  }
  model.net().train(was_training);
  return total / static_cast<double>(num);
}

Result<TrainSummary> train_ddpm(const v1::RunConfig& cfg, const std::string& config_source,
                                Device device) {
  const auto& tc = cfg.train();
  if (tc.threads() > 0) omp_set_num_threads(tc.threads());
  const DdpmConfig dc = DdpmConfig::from_proto(cfg);
  RETURN_IF_ERROR(dc.validate(), config_source);

  ASSIGN_OR_RETURN(data::MnistSet train_set,
                   load_images(cfg.data().data_dir(), cfg.data().dataset(), true, config_source));
  ASSIGN_OR_RETURN(data::MnistSet val_set,
                   load_images(cfg.data().data_dir(), cfg.data().dataset(), false, config_source));
  if (train_set.rows != dc.unet.image_size || train_set.cols != dc.unet.image_size ||
      dc.unet.in_channels != 1) {
    return invalid_argument(fmt::format(
        "{}: keys 'ddpm.image_size' = {} and 'ddpm.image_channels' = {} do not match {} ({}x{}, "
        "1 channel)",
        config_source, dc.unet.image_size, dc.unet.in_channels, cfg.data().dataset(),
        train_set.rows, train_set.cols));
  }
  const Tensor train_x = to_model_space(train_set), val_x = to_model_space(val_set);
  spdlog::info("data: {} ({} train, {} test images of {}x{})", cfg.data().dataset(),
               train_set.size(), val_set.size(), train_set.rows, train_set.cols);

  Ddpm model(dc, tc.seed());
  if (!device.is_cpu()) RETURN_IF_ERROR(model.to(device), config_source + ": the model");
  spdlog::info(
      "model: DDPM U-Net base {} mult [{}] res blocks {} attention {} | T={} {} schedule | "
      "{:.3f}M parameters, EMA {}, seed {}, on {}",
      dc.unet.base_channels, fmt::join(dc.unet.channel_mult, ", "), dc.unet.num_res_blocks,
      dc.unet.attention, dc.schedule.timesteps,
      dc.schedule.schedule == NoiseSchedule::kCosine ? "cosine" : "linear",
      static_cast<double>(model.net().num_parameters()) / 1e6, dc.ema_decay, tc.seed(),
      device_str(device));
  std::unique_ptr<optim::Optimizer> opt;
  auto groups = optim::decay_matrices_only(model.net().parameters());
  if (tc.optimizer() == v1::TrainConfig::SGD) {
    opt = std::make_unique<optim::Sgd>(groups,
                                       optim::SgdOptions{tc.momentum(), tc.weight_decay(), false});
  } else {
    opt = std::make_unique<optim::AdamW>(
        groups, optim::AdamWOptions{tc.beta1(), tc.beta2(), 1e-8, tc.weight_decay()});
  }
  const optim::CosineSchedule sched{tc.learning_rate(), tc.min_lr(), tc.warmup_iters(),
                                    tc.lr_decay_iters()};

  const std::filesystem::path out_dir = tc.out_dir();
  ASSIGN_OR_RETURN(std::ofstream metrics, config::open_run_dir(cfg, config_source));

  Rng batch_rng(tc.seed() + 1);
  Rng noise_rng(tc.seed() + 3);
  spdlog::info("rng: batches seed {}, noise seed {}, evaluation seed {}", tc.seed() + 1,
               tc.seed() + 3, kEvalSeed);
  const int64_t b = tc.batch_size(), max_iters = tc.max_iters();
  const int64_t eval_imgs = std::max(1, tc.eval_iters()) * b;
  TrainSummary sum;
  sum.best_val_loss = 1e30;
  sum.checkpoint = out_dir / "ckpt.safetensors";
  const auto t0 = Clock::now();
  double train_seconds = 0.0, window_seconds = 0.0;
  int64_t window_images = 0;

  for (int64_t it = 0; it <= max_iters; ++it) {
    const double lr = tc.decay_lr() ? sched.at(it) : tc.learning_rate();
    if ((tc.eval_interval() > 0 && it % tc.eval_interval() == 0) || it == max_iters) {
      const double tr = ddpm_eval_loss(model, train_x, eval_imgs, b, kEvalSeed);
      const double va = ddpm_eval_loss(model, val_x, eval_imgs, b, kEvalSeed);
      sum.train_loss = tr;
      sum.val_loss = va;
      spdlog::info("step {}: train loss {:.5f}, val loss {:.5f} (epsilon MSE)", it, tr, va);
      metrics << "{\"event\":\"eval\",\"iter\":" << it << ",\"train_loss\":" << tr
              << ",\"val_loss\":" << va << "}\n";
      metrics.flush();
      const DdpmCheckpointInfo info{it, tr, va};
      if (it > 0 && va < sum.best_val_loss) {
        sum.best_val_loss = va;
        RETURN_IF_ERROR(save_ddpm_checkpoint(out_dir / "best.safetensors", model, cfg, info));
      }
      RETURN_IF_ERROR(save_ddpm_checkpoint(sum.checkpoint, model, cfg, info));
    }
    if (it == max_iters) break;

    const auto s0 = Clock::now();
    std::vector<int64_t> idx(static_cast<size_t>(b));
    for (auto& v : idx)
      v = static_cast<int64_t>(batch_rng.below(static_cast<uint64_t>(train_set.size())));
    Tensor loss = model.loss(gather(train_x, idx), noise_rng);
    const double loss_v = loss.item();
    if (!std::isfinite(loss_v)) {
      return internal_error("training diverged at step " + std::to_string(it) + ": loss is " +
                            std::to_string(loss_v) + " (lower train.learning_rate?)");
    }
    autograd::backward(loss);
    const double gnorm = optim::clip_grad_norm(model.net().parameters(), tc.grad_clip());
    opt->step(lr);
    opt->zero_grad();
    model.update_ema(it);
    const double step_seconds = std::chrono::duration<double>(Clock::now() - s0).count();
    train_seconds += step_seconds;
    window_seconds += step_seconds;
    window_images += b;
    sum.iters = it + 1;
    if (tc.log_interval() > 0 && (it % tc.log_interval() == 0 || it + 1 == max_iters)) {
      const double ips =
          window_seconds > 0 ? static_cast<double>(window_images) / window_seconds : 0;
      spdlog::info(
          "step {}/{} | loss {:.5f} | lr {:.2e} | grad norm {:.3f} | {:.1f} img/s | ETA {}", it,
          max_iters, loss_v, lr, gnorm, ips,
          format_eta(train_seconds / static_cast<double>(it + 1) *
                     static_cast<double>(max_iters - it - 1)));
      metrics << "{\"event\":\"train\",\"iter\":" << it << ",\"loss\":" << loss_v
              << ",\"lr\":" << lr << ",\"grad_norm\":" << gnorm << ",\"images_per_s\":" << ips
              << "}\n";
      window_seconds = 0.0;
      window_images = 0;
    }
  }

  Rng sample_rng(cfg.sample().seed());
  const auto s0 = Clock::now();
  const Tensor samples = model.sample(dc.num_samples, sample_rng);
  const auto grid = out_dir / "samples.png";
  RETURN_IF_ERROR(write_image_grid(
      grid, samples,
      static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(dc.num_samples))))));
  spdlog::info("samples: {} images, {} steps, in {:.1f} s -> {}", dc.num_samples, dc.sampler.steps,
               std::chrono::duration<double>(Clock::now() - s0).count(), grid.string());

  sum.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  sum.tokens_per_second =
      train_seconds > 0 ? static_cast<double>(sum.iters * b) / train_seconds : 0.0;
  spdlog::info(
      "done: {} steps in {:.1f} s ({:.1f} images/s training), val loss {:.5f}, "
      "checkpoint {}",
      sum.iters, sum.seconds, sum.tokens_per_second, sum.val_loss, sum.checkpoint.string());
  return sum;
}

Result<std::string> sample_ddpm_checkpoint(const DdpmSampleOptions& o) {
  ASSIGN_OR_RETURN(LoadedDdpm loaded, load_ddpm_checkpoint(o.checkpoint));
  if (!o.device.is_cpu()) RETURN_IF_ERROR(loaded.model->to(o.device), o.checkpoint.string());
  if (loaded.config.train().threads() > 0) omp_set_num_threads(loaded.config.train().threads());
  const DdpmConfig& dc = loaded.model->config();
  SamplerConfig sc = dc.sampler;
  if (o.steps > 0) sc.steps = o.steps;
  if (sc.steps > dc.schedule.timesteps) {
    return invalid_argument("--steps " + std::to_string(sc.steps) +
                            " exceeds ddpm.timesteps = " + std::to_string(dc.schedule.timesteps));
  }
  if (o.sampler) {
    if (*o.sampler == "ddim") {
      sc.sampler = DdpmSampler::kDdim;
    } else if (*o.sampler == "ancestral" || *o.sampler == "ddpm") {
      sc.sampler = DdpmSampler::kAncestral;
    } else {
      return invalid_argument("--sampler '" + *o.sampler + "': expected ddim or ancestral");
    }
  }
  if (o.eta) {
    if (!(*o.eta >= 0.0 && *o.eta <= 1.0)) return invalid_argument("--eta must be in [0, 1]");
    sc.eta = *o.eta;
  }
  const int64_t num = o.num > 0 ? o.num : dc.num_samples;
  const int64_t cols =
      o.cols > 0 ? o.cols : static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(num))));
  const std::filesystem::path out =
      o.out_png.empty() ? o.checkpoint.parent_path() / "samples.png" : o.out_png;
  spdlog::info(
      "sampling {} images from {} (step {}, val loss {:.5f}): {} sampler, {} steps{}, "
      "seed {}, on {}",
      num, o.checkpoint.string(), loaded.info.iter, loaded.info.val_loss,
      sc.sampler == DdpmSampler::kDdim ? "ddim" : "ancestral", sc.steps,
      sc.sampler == DdpmSampler::kDdim ? fmt::format(", eta {}", sc.eta) : "", o.seed,
      device_str(o.device));
  Rng rng(o.seed);
  const auto t0 = Clock::now();
  const Tensor images = loaded.model->sample(num, rng, &sc, [&](int64_t done) {
    if (done % 10 == 0) spdlog::info("step {}/{}", done, sc.steps);
  });
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  RETURN_IF_ERROR(write_image_grid(out, images, cols));
  std::string report = fmt::format("wrote {} samples ({} steps, {:.1f} s, {}) to {}", num, sc.steps,
                                   secs, device_str(o.device), out.string());
  if (o.classify) {
    const auto& cfg = loaded.config;
    const std::string dd = o.data_dir.empty() ? cfg.data().data_dir() : o.data_dir;
    const std::string where = "checkpoint " + o.checkpoint.string();
    ASSIGN_OR_RETURN(data::MnistSet train, load_images(dd, cfg.data().dataset(), true, where));
    ASSIGN_OR_RETURN(data::MnistSet test, load_images(dd, cfg.data().dataset(), false, where));
    ASSIGN_OR_RETURN(SampleQuality q,
                     classify_samples(images, train, test, o.classifier_epochs, o.seed));
    report += "\n" + q.summary();
  }
  return report;
}

}  // namespace starling::models
