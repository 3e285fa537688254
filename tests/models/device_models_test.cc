// The image models train on a device through the ops' device forms: a U-Net and a CNN moved to
// the emulated device (tests/testing/emulated_device.h) take the same AdamW / SGD steps, with
// gradient clipping, as their CPU twins and end with bit-identical parameters; parameters,
// gradients and optimizer state stay on the device throughout. tests/cuda/device_ops_cuda_test.cc
// runs the same steps on a GPU.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/config/toml_config.h"
#include "core/io/safetensors.h"
#include "models/ddpm/trainer.h"
#include "tests/testing/device_model_cases.h"
#include "tests/testing/emulated_device.h"

namespace starling {
namespace {

TEST_CASE("a U-Net trains on the device exactly as on the CPU", "[models][device]") {
  testing::EmulatedDevice device;
  testing::unet_steps_on(testing::EmulatedDevice::device(), 3, 0.0);
}

TEST_CASE("a CNN classifier trains on the device exactly as on the CPU", "[models][device]") {
  testing::EmulatedDevice device;
  testing::cnn_steps_on(testing::EmulatedDevice::device(), 3, 0.0);
}

TEST_CASE("train_ddpm on the device writes the CPU run's checkpoint and samples",
          "[models][device][ddpm]") {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / "starling_ddpm_device";
  fs::remove_all(root);
  auto run = [&](const std::string& name, Device device) {
    v1::RunConfig cfg;
    const std::string toml = std::string(R"(
[model]
arch = "ddpm"
[data]
dataset = "mnist"
data_dir = ")") + STARLING_SOURCE_DIR +
                             R"(/tests/fixtures/data"
[train]
batch_size = 4
max_iters = 3
eval_interval = 2
eval_iters = 1
log_interval = 1
grad_clip = 0.5
warmup_iters = 1
lr_decay_iters = 3
out_dir = ")" + (root / name).string() +
                             R"("
[ddpm]
image_size = 28
base_channels = 4
channel_mult = [1, 2]
groups = 2
attention = true
dropout = 0.1
timesteps = 50
sampling_steps = 5
num_samples = 2
ema_decay = 0.9
)";
    REQUIRE(config::parse_toml(toml, name + ".toml", &cfg).ok());
    auto res = models::train_ddpm(cfg, name + ".toml", device);
    REQUIRE(res.ok());
    return *res;
  };
  const auto cpu = run("cpu", Device::cpu());
  models::TrainSummary dev;
  {
    testing::EmulatedDevice device;
    dev = run("dev", testing::EmulatedDevice::device());
  }
  CHECK(cpu.val_loss == dev.val_loss);
  auto a = io::load_safetensors(cpu.checkpoint);
  auto b = io::load_safetensors(dev.checkpoint);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(a->tensors.size() == b->tensors.size());
  for (size_t i = 0; i < a->tensors.size(); ++i) {
    INFO(a->tensors[i].first);
    CHECK(a->tensors[i].first == b->tensors[i].first);
    CHECK(a->tensors[i].second.to_float_vector() == b->tensors[i].second.to_float_vector());
  }
  // The sample grids (drawn through the device's network) are the same bytes.
  auto bytes = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  CHECK(bytes(root / "cpu" / "samples.png") == bytes(root / "dev" / "samples.png"));
  fs::remove_all(root);
}

}  // namespace
}  // namespace starling
