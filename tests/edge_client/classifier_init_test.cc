// The classifiers' initial weights: PyTorch's, Glorot's and the TensorFlow 1 tutorials'
// truncated normal, on the 2NN and the CNN, and the [model] keys that choose them.
#include <catch2/catch.hpp>
#include <cmath>

#include "core/config/toml_config.h"
#include "edge_client/mnist_trainer.h"
#include "models/mlp/cnn.h"
#include "models/mlp/mlp.h"

namespace starling::models {
namespace {

struct Moments {
  double mean = 0, var = 0, max_abs = 0;
};

Moments moments(const Tensor& t) {
  const float* p = t.data<float>();
  Moments m;
  for (int64_t i = 0; i < t.numel(); ++i) m.mean += p[i];
  m.mean /= static_cast<double>(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) {
    m.var += (p[i] - m.mean) * (p[i] - m.mean);
    m.max_abs = std::max(m.max_abs, std::fabs(static_cast<double>(p[i])));
  }
  m.var /= static_cast<double>(t.numel());
  return m;
}

TEST_CASE("the 2NN's default init is PyTorch's nn.Linear", "[models]") {
  Mlp mlp(MlpConfig{784, 200, 10}, 3);
  const auto named = mlp.named_parameters();
  REQUIRE(named.size() == 6);
  for (const auto& [name, t] : named) {
    INFO(name);
    const double fan_in = name[2] == '1' ? 784.0 : 200.0;
    const double bound = 1.0 / std::sqrt(fan_in);
    const Moments m = moments(t);
    CHECK(m.max_abs <= bound);
    if (t.numel() > 1000) {
      CHECK(m.max_abs > 0.99 * bound);
      CHECK(m.var == Approx(bound * bound / 3.0).epsilon(0.05));
    }
  }
}

TEST_CASE("Glorot init: uniform in sqrt(6 / (fan_in + fan_out)), zero biases", "[models]") {
  InitSpec glorot;
  glorot.kind = ClassifierInit::kGlorot;
  Mlp mlp(MlpConfig{784, 200, 10}, 3, glorot);
  const auto named = mlp.named_parameters();
  const double fans[3][2] = {{784, 200}, {200, 200}, {200, 10}};
  for (int layer = 0; layer < 3; ++layer) {
    const Tensor& w = named[2 * layer].second;
    const double bound = std::sqrt(6.0 / (fans[layer][0] + fans[layer][1]));
    const Moments m = moments(w);
    CHECK(m.max_abs <= bound);
    CHECK(m.max_abs > 0.98 * bound);
    CHECK(m.var == Approx(bound * bound / 3.0).epsilon(0.1));
    CHECK(moments(named[2 * layer + 1].second).max_abs == 0.0);
  }
}

TEST_CASE("truncated normal init: N(0, std^2) cut at 2 std, constant biases", "[models]") {
  const CnnConfig c{28, 8, 16, 32, 10};
  InitSpec tn;
  tn.kind = ClassifierInit::kTruncatedNormal;
  tn.std = 0.1;
  tn.bias = 0.1;
  Cnn cnn(c, 5, tn);
  for (const auto& [name, t] : cnn.named_parameters()) {
    INFO(name);
    const Moments m = moments(t);
    if (name.ends_with("bias")) {
      CHECK(m.mean == Approx(0.1));
      CHECK(m.var == Approx(0.0).margin(1e-12));
      continue;
    }
    CHECK(m.max_abs <= 0.2 + 1e-7);
    // The normal truncated at +-2 sigma has standard deviation 0.8796 sigma.
    if (t.numel() >= 1000) {
      CHECK(std::sqrt(m.var) == Approx(0.08796).epsilon(0.05));
      CHECK(m.mean == Approx(0.0).margin(0.01));
    }
  }
  // The same seed gives the same weights; another seed others.
  Cnn again(c, 5, tn), other(c, 6, tn);
  const auto a = cnn.named_parameters(), b = again.named_parameters(), o = other.named_parameters();
  const Tensor& w = a[0].second;
  CHECK(std::equal(w.data<float>(), w.data<float>() + w.numel(), b[0].second.data<float>()));
  CHECK_FALSE(std::equal(w.data<float>(), w.data<float>() + w.numel(), o[0].second.data<float>()));
}

TEST_CASE("[model] init reaches the federation's classifier", "[models]") {
  v1::FederationConfig f;
  REQUIRE(config::parse_toml("[model]\ninit = \"TRUNCATED_NORMAL\"\ninit_std = 0.05\ninit_bias = "
                             "0.2\n",
                             "m.toml", &f)
              .ok());
  edge_client::MnistTrainerOptions o;
  o.hidden = 16;
  o.init = edge_client::init_spec(f.model());
  CHECK(o.init.kind == ClassifierInit::kTruncatedNormal);
  const auto model = edge_client::make_mnist_model(o, 784, 1);
  const auto named = model->named_parameters();  // a copy: the tensors share the model's storage
  CHECK(moments(named[0].second).max_abs <= 0.1 + 1e-7);
  CHECK(moments(named[1].second).mean == Approx(0.2));
  v1::FederationConfig bad;
  const Status typo = config::parse_toml("[model]\ninit = \"XAVIER\"\n", "b.toml", &bad);
  CHECK_FALSE(typo.ok());
  CHECK_THAT(typo.message(), Catch::Contains("b.toml") && Catch::Contains("init"));
}

}  // namespace
}  // namespace starling::models
