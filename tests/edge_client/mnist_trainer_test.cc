// The 2NN and the MNIST local trainer on a tiny synthetic dataset: loss falls, a round repeats
// bit for bit, FedProx pulls the local model toward the global one.
#include "edge_client/mnist_trainer.h"

#include <catch2/catch.hpp>
#include <cmath>

#include "core/util/rng.h"
#include "edge_client/model_params.h"
#include "tests/testing/emulated_device.h"

namespace starling::edge_client {
namespace {

// 40 examples of 4x4 "images": class c lights pixel c (plus noise), 4 classes.
std::shared_ptr<data::MnistSet> tiny_set() {
  auto set = std::make_shared<data::MnistSet>();
  set->rows = 4;
  set->cols = 4;
  Rng rng(5);
  for (int i = 0; i < 40; ++i) {
    const int c = i % 4;
    for (int p = 0; p < 16; ++p)
      set->images.push_back(0.1f * rng.uniform_f() + (p == c ? 1.f : 0.f));
    set->labels.push_back(c);
  }
  return set;
}

v1::RoundPlan plan_of(uint32_t steps, float lr, uint64_t seed = 3) {
  v1::RoundPlan p;
  p.set_round(1);
  p.set_local_steps(steps);
  p.set_batch_size(10);
  p.set_learning_rate(lr);
  p.set_seed(seed);
  return p;
}

MnistTrainerOptions opts(int64_t hidden, uint32_t epochs, float mu) {
  MnistTrainerOptions o;
  o.hidden = hidden;
  o.epochs = epochs;
  o.prox_mu = mu;
  return o;
}

std::vector<int64_t> all(int n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

TEST_CASE("local training lowers the loss and repeats bit for bit", "[edge_client]") {
  auto set = tiny_set();
  MnistTrainer trainer(set, all(40), opts(8, 1, 0.0f));
  const auto n = static_cast<size_t>(compress::validate_layout(trainer.layout()).value());
  models::Mlp init(models::MlpConfig{16, 8, 10}, 7);
  const auto global = flatten(init);
  REQUIRE(global.size() == n);

  std::vector<float> d1(n), d2(n);
  auto short_run = trainer.train(global, plan_of(1, 0.5f), d1);
  REQUIRE(short_run.ok());
  auto long_run = trainer.train(global, plan_of(200, 0.5f), d2);
  REQUIRE(long_run.ok());
  CHECK(long_run->num_samples == 40);
  CHECK(long_run->loss < short_run->loss);

  std::vector<float> again(n);
  REQUIRE(trainer.train(global, plan_of(200, 0.5f), again).ok());
  CHECK(again == d2);

  // Evaluate the trained model: it separates the four classes.
  models::Mlp trained(models::MlpConfig{16, 8, 10}, 7);
  std::vector<float> local(n);
  for (size_t i = 0; i < n; ++i) local[i] = global[i] + d2[i];
  REQUIRE(load_flat(trained, local).ok());
  const auto eval = models::evaluate(trained, set->images.data(), set->labels.data(), 40, 16);
  CHECK(eval.accuracy == 1.0);
}

TEST_CASE("the FedProx term keeps the local model near the global one", "[edge_client]") {
  auto set = tiny_set();
  MnistTrainer plain(set, all(40), opts(8, 1, 0.0f));
  MnistTrainer prox(set, all(40), opts(8, 1, 1.0f));
  models::Mlp init(models::MlpConfig{16, 8, 10}, 7);
  const auto global = flatten(init);
  std::vector<float> a(global.size()), b(global.size());
  REQUIRE(plain.train(global, plan_of(50, 0.5f), a).ok());
  REQUIRE(prox.train(global, plan_of(50, 0.5f), b).ok());
  double na = 0, nb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    na += double(a[i]) * a[i];
    nb += double(b[i]) * b[i];
  }
  CHECK(std::sqrt(nb) < std::sqrt(na));
}

TEST_CASE("an empty partition is an error, not a crash", "[edge_client]") {
  MnistTrainer trainer(tiny_set(), {}, {});
  const auto n = static_cast<size_t>(compress::validate_layout(trainer.layout()).value());
  std::vector<float> global(n), delta(n);
  CHECK_FALSE(trainer.train(global, plan_of(1, 0.1f), delta).ok());
}

TEST_CASE("the CNN trainer learns the tiny images and keeps the paper's names", "[edge_client]") {
  MnistTrainerOptions o = opts(8, 1, 0.0f);
  o.model = MnistModel::kCnn;
  o.cnn = models::CnnConfig{0, 4, 8, 16, 10};
  MnistTrainer trainer(tiny_set(), all(40), o);
  const auto& layout = trainer.layout();
  REQUIRE(layout.size() == 8);
  CHECK(layout[0].name == "conv1.weight");
  CHECK(layout[0].shape == Shape{4, 1, 5, 5});
  CHECK(layout[4].shape == Shape{16, 8});  // fc1: 8 channels x (4/4)^2
  auto init = make_mnist_model(o, 16, 7);
  const auto global = flatten(*init);
  std::vector<float> delta(global.size());
  auto first = trainer.train(global, plan_of(1, 0.05f), delta);
  REQUIRE(first.ok());
  auto longer = trainer.train(global, plan_of(120, 0.05f), delta);
  REQUIRE(longer.ok());
  CHECK(longer->loss < first->loss);
  CHECK(trainer.working_set_bytes(plan_of(1, 0.05f)) > 0);
}

TEST_CASE("the 2NN and the CNN train on a device exactly as on the CPU", "[edge_client][device]") {
  // Plain SGD and SGD with FedProx's term: the delta and loss are the CPU round's, bit for bit,
  // with the model and its gradients on the (emulated) device; tests/cuda runs the same on a GPU.
  for (const bool cnn : {false, true}) {
    for (const float mu : {0.0f, 0.5f}) {
      INFO((cnn ? "CNN" : "2NN") << ", prox_mu " << mu);
      MnistTrainerOptions o = opts(8, 1, mu);
      if (cnn) {
        o.model = MnistModel::kCnn;
        o.cnn = models::CnnConfig{0, 4, 8, 16, 10};
      }
      const auto global = flatten(*make_mnist_model(o, 16, 7));
      std::vector<float> cpu_delta(global.size()), dev_delta(global.size());
      MnistTrainer cpu(tiny_set(), all(40), o);
      testing::EmulatedDevice device;
      o.device = testing::EmulatedDevice::device();
      MnistTrainer dev(tiny_set(), all(40), o);
      for (int round = 0; round < 2; ++round) {
        auto rc = cpu.train(global, plan_of(6, 0.05f, 3 + round), cpu_delta);
        auto rd = dev.train(global, plan_of(6, 0.05f, 3 + round), dev_delta);
        REQUIRE(rc.ok());
        REQUIRE(rd.ok());
        CHECK(rc->loss == rd->loss);
        CHECK(cpu_delta == dev_delta);
      }
    }
  }
}

}  // namespace
}  // namespace starling::edge_client
