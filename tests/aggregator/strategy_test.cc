// Server optimizers against their formulas, evaluated in double.
#include "aggregator/strategy.h"

#include <catch2/catch.hpp>
#include <cmath>

namespace starling::aggregator {
namespace {

TEST_CASE("server optimizers follow Reddi et al.", "[aggregator]") {
  const auto kind = GENERATE(StrategyKind::kFedAvg, StrategyKind::kFedAvgM, StrategyKind::kFedAdam,
                             StrategyKind::kFedYogi, StrategyKind::kFedAdagrad);
  StrategyOptions o;
  o.kind = kind;
  o.server_lr = 0.5f;
  ServerOptimizer opt(o, 3);
  std::vector<float> x = {1, -2, 0.5f};
  std::vector<double> xr(x.begin(), x.end()), m(3, 0), v(3, double(o.tau) * o.tau);
  const std::vector<std::vector<float>> deltas = {
      {0.1f, -0.3f, 0}, {0.2f, 0.1f, -0.5f}, {-0.4f, 0.0f, 0.25f}};
  for (const auto& d : deltas) {
    opt.apply(x, d);
    for (int i = 0; i < 3; ++i) {
      const double di = d[i];
      switch (kind) {
        case StrategyKind::kFedAvg:
          xr[i] += o.server_lr * di;
          break;
        case StrategyKind::kFedAvgM:
          m[i] = o.momentum * m[i] + di;
          xr[i] += o.server_lr * m[i];
          break;
        default:
          m[i] = o.beta1 * m[i] + (1 - o.beta1) * di;
          if (kind == StrategyKind::kFedAdam) v[i] = o.beta2 * v[i] + (1 - o.beta2) * di * di;
          if (kind == StrategyKind::kFedYogi) {
            const double s = v[i] > di * di ? 1 : (v[i] < di * di ? -1 : 0);
            v[i] = v[i] - (1 - o.beta2) * di * di * s;
          }
          if (kind == StrategyKind::kFedAdagrad) v[i] += di * di;
          xr[i] += o.server_lr * m[i] / (std::sqrt(v[i]) + o.tau);
      }
    }
  }
  INFO(strategy_name(kind));
  for (int i = 0; i < 3; ++i) CHECK(x[i] == Approx(xr[i]).margin(1e-5));
}

TEST_CASE("strategy names round-trip", "[aggregator]") {
  for (auto k : {StrategyKind::kFedAvg, StrategyKind::kFedAdam, StrategyKind::kFedYogi}) {
    auto p = parse_strategy(strategy_name(k));
    REQUIRE(p.ok());
    CHECK(*p == k);
  }
  CHECK_FALSE(parse_strategy("sgd").ok());
}

}  // namespace
}  // namespace starling::aggregator
