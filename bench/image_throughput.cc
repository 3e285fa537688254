// Training throughput of the image models on their shipped configs' shapes, one step = forward +
// backward + optimizer step, random inputs from fixed seeds, median over timed steps:
// --model ddpm: configs/ddpm_mnist_cpu.toml's U-Net, the step of `starling train` (Ddpm::loss
//   epsilon MSE, clip_grad_norm, the config's optimizer, EMA update);
// --model cnn / 2nn: configs/fed_mnist_{cnn,2nn}_iid.toml's classifier, the federated client's
//   local step (edge_client/mnist_trainer.cc: cross-entropy, plain SGD at [local] learning_rate).
// --threads replaces the config's [train] threads. --device cuda (--gpu N) trains on a GPU
// through the ops' CUDA forms (cuDNN convolutions; the classifier steps with core/optim's SGD,
// the same update as the client's), batches drawn on the host and moved untimed, each timed step
// ending when the GPU is done. Prints one JSON line with the peak RSS (VmHWM), the RSS before the
// model was built and, on a GPU, the peak of the tensor allocator.
// bench/train_throughput.sh runs it beside bench/torch_image.py.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd/autograd.h"
#include "core/config/toml_config.h"
#include "core/cuda/tensor_backend.h"
#include "core/ops/blas_core.h"
#include "core/ops/ops.h"
#include "core/optim/optimizer.h"
#include "core/util/memory.h"
#include "core/wire/federation.pb.h"
#include "edge_client/mnist_trainer.h"
#include "models/ddpm/ddpm.h"

namespace {

using starling::Rng;
using starling::Tensor;

// A "VmRSS:" / "VmHWM:" line of /proc/self/status (current / peak resident set) in MiB, 0 if
// unknown.
double status_mb(const std::string& field) {
  std::ifstream f("/proc/self/status");
  std::string key;
  while (f >> key) {
    if (key == field) {
      double kb = 0;
      f >> kb;
      return kb / 1024.0;
    }
    f.ignore(1 << 16, '\n');
  }
  return 0.0;
}

// One model's benchmark: `draw` makes the next random batch (untimed), `step` trains on it and
// returns the loss.
struct Bench {
  std::function<void()> draw;
  std::function<double()> step;
  int64_t params = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"starling image-model training throughput"};
  std::string model = "ddpm", config_path;
  int64_t batch = 0, warmup = 3, steps = 20;
  int threads = 0;
  app.add_option("--model", model, "ddpm, cnn or 2nn")
      ->check(CLI::IsMember({"ddpm", "cnn", "2nn"}))
      ->capture_default_str();
  app.add_option("--config", config_path, "default: the model's shipped config");
  app.add_option("--batch", batch, "0: the config's batch size")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--warmup", warmup)->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--steps", steps)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--threads", threads, "0: all cores")->capture_default_str();
  std::string device_name = "cpu";
  int gpu = 0;
  app.add_option("--device", device_name, "cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--gpu", gpu, "the GPU of --device cuda")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  starling::Device device;
  if (device_name == "cuda") {
    if (auto st = starling::cuda::install_tensor_backend(); !st.ok()) {
      std::fprintf(stderr, "--device cuda: %s\n", st.to_string().c_str());
      return 1;
    }
    device = starling::Device::cuda(gpu);
  }
  // A device tensor moved to or read from the host: a blocking copy, so the GPU is done.
  auto on = [device](const Tensor& t) { return device.is_cpu() ? t : *t.to(device); };
  // STARLING_CUDA_TF32=1 (the ops' CUDA table reads it): TF32 convolutions and linears.
  const char* tf32_env = std::getenv("STARLING_CUDA_TF32");
  const bool tf32 = !device.is_cpu() && tf32_env != nullptr && std::string(tf32_env) == "1";
  if (threads > 0) omp_set_num_threads(threads);
  const double start_rss_mb = status_mb("VmRSS:");  // before the model: the program itself
  if (config_path.empty()) {
    config_path = model == "ddpm" ? "configs/ddpm_mnist_cpu.toml"
                                  : "configs/fed_mnist_" + model + "_iid.toml";
  }

  Rng rng(1);  // inputs, labels, diffusion times and noise
  Bench bench;
  Tensor x, y;
  // The models and optimizers the step closures refer to, kept alive here.
  std::unique_ptr<starling::models::Ddpm> ddpm;
  std::unique_ptr<starling::optim::Optimizer> opt;
  std::unique_ptr<starling::models::Classifier> clf;
  if (model == "ddpm") {
    auto rc = starling::config::load_run_config(config_path);
    if (!rc.ok()) {
      std::fprintf(stderr, "%s\n", rc.status().to_string().c_str());
      return 1;
    }
    const auto& tc = rc->train();
    const auto dc = starling::models::DdpmConfig::from_proto(*rc);
    if (auto st = dc.validate(); !st.ok()) {
      std::fprintf(stderr, "%s: %s\n", config_path.c_str(), st.to_string().c_str());
      return 1;
    }
    if (batch == 0) batch = tc.batch_size();
    ddpm = std::make_unique<starling::models::Ddpm>(dc, tc.seed());
    if (auto st = ddpm->to(device); !st.ok()) {
      std::fprintf(stderr, "%s\n", st.to_string().c_str());
      return 1;
    }
    // As models/ddpm/trainer.cc: decay on matrices only, the config's optimizer, a fixed lr
    // (the schedule's value does not change the work).
    auto groups = starling::optim::decay_matrices_only(ddpm->net().parameters());
    if (tc.optimizer() == starling::v1::TrainConfig::SGD) {
      opt = std::make_unique<starling::optim::Sgd>(
          groups, starling::optim::SgdOptions{tc.momentum(), tc.weight_decay(), false});
    } else {
      opt = std::make_unique<starling::optim::AdamW>(
          groups, starling::optim::AdamWOptions{tc.beta1(), tc.beta2(), 1e-8, tc.weight_decay()});
    }
    const int64_t side = dc.unet.image_size, ch = dc.unet.in_channels;
    const double lr = tc.learning_rate(), clip = tc.grad_clip();
    bench.params = ddpm->net().num_parameters();
    bench.draw = [&x, &rng, batch, side, ch]() {
      x = Tensor::uniform({batch, ch, side, side}, rng, -1.0, 1.0);
    };
    starling::util::keep_freed_memory();  // as `starling train`
    bench.step = [&ddpm, &opt, &x, &rng, lr, clip, it = int64_t{0}]() mutable {
      Tensor loss = ddpm->loss(x, rng);
      const double v = loss.item();
      starling::autograd::backward(loss);
      starling::optim::clip_grad_norm(ddpm->net().parameters(), clip);
      opt->step(lr);
      opt->zero_grad();
      ddpm->update_ema(it++);
      (void)ddpm->net().parameters().back().item();  // waits for a GPU's queue
      return v;
    };
  } else {
    starling::v1::FederationConfig fc;
    if (auto st = starling::config::load_toml(config_path, &fc); !st.ok()) {
      std::fprintf(stderr, "%s\n", st.to_string().c_str());
      return 1;
    }
    const bool cnn = model == "cnn";
    if ((fc.model().arch() == starling::v1::FedModelConfig::CNN) != cnn ||
        (!cnn && fc.model().arch() != starling::v1::FedModelConfig::MLP)) {
      std::fprintf(stderr, "%s: [model] arch is not %s\n", config_path.c_str(),
                   cnn ? "CNN" : "MLP (the 2NN)");
      return 1;
    }
    // The options aggregator/fed_task.cc gives the MNIST clients.
    starling::edge_client::MnistTrainerOptions o;
    o.hidden = fc.model().hidden();
    o.init = starling::edge_client::init_spec(fc.model());
    if (cnn) {
      o.model = starling::edge_client::MnistModel::kCnn;
      o.cnn.channels1 = fc.model().cnn_channels1();
      o.cnn.channels2 = fc.model().cnn_channels2();
      o.cnn.hidden = fc.model().cnn_fc();
    }
    constexpr int64_t kPixels = 28 * 28;
    clf = starling::edge_client::make_mnist_model(o, kPixels, fc.model().seed());
    if (auto st = clf->to(device); !st.ok()) {
      std::fprintf(stderr, "%s\n", st.to_string().c_str());
      return 1;
    }
    if (!device.is_cpu()) {  // the client's update (w -= lr g) as core/optim's SGD
      opt = std::make_unique<starling::optim::Sgd>(
          starling::optim::decay_matrices_only(clf->parameters()), starling::optim::SgdOptions{});
    }
    if (batch == 0) batch = fc.local().batch_size();
    const float lr = fc.local().learning_rate();
    bench.params = clf->num_parameters();
    bench.draw = [&x, &y, &rng, batch, on]() {
      x = on(Tensor::uniform({batch, kPixels}, rng, 0.0, 1.0));
      std::vector<int32_t> labels(static_cast<size_t>(batch));
      for (auto& l : labels) l = static_cast<int32_t>(rng.below(10));
      y = on(Tensor::from_vector(labels, {batch}));
    };
    bench.step = [&clf, &opt, &x, &y, lr]() {
      clf->zero_grad();
      Tensor loss = starling::ops::cross_entropy(clf->forward(x), y);
      const double v = loss.item();
      starling::autograd::backward(loss);
      if (opt) {
        opt->step(lr);
        (void)clf->parameters().back().item();  // waits for the GPU's queue
      } else {
        starling::optim::sgd_prox_step(clf->parameters(), lr, 0.0f, nullptr);  // as the client
      }
      return v;
    };
  }

  std::vector<double> times;
  double loss_v = 0;
  for (int64_t s = 0; s < warmup + steps; ++s) {
    bench.draw();
    const auto t0 = std::chrono::steady_clock::now();
    loss_v = bench.step();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s >= warmup) times.push_back(dt);
  }
  std::sort(times.begin(), times.end());
  const double med = times[times.size() / 2];
  std::printf(
      "{\"engine\":\"starling\",\"model\":\"%s\",\"threads\":%d,\"batch\":%lld,"
      "\"ms_per_step\":%.3f,\"samples_per_s\":%.1f,\"params\":%lld,\"peak_rss_mb\":%.1f,"
      "\"start_rss_mb\":%.1f,\"loss\":%.4f,\"blas\":\"%s\",\"device\":\"%s\","
      "\"peak_device_mb\":%.1f,\"tf32\":%s}\n",
      model.c_str(), omp_get_max_threads(), static_cast<long long>(batch), med * 1e3,
      static_cast<double>(batch) / med, static_cast<long long>(bench.params), status_mb("VmHWM:"),
      start_rss_mb, loss_v, starling::ops::blas_core().c_str(),
      starling::device_str(device).c_str(),
      device.is_cpu()
          ? 0.0
          : static_cast<double>(starling::cuda::tensor_allocator_stats(gpu).peak_in_use) /
                (1024.0 * 1024.0),
      tf32 ? "true" : "false");
  return 0;
}
